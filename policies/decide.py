"""Turn a request's facts and score into a `RouteDecision`. Pure: no I/O, no HTTP."""

from __future__ import annotations

from dataclasses import dataclass

from policies.schema import Policy, Rule, RuleMatch

__all__ = ["AUTO_MODEL", "RouteContext", "RouteDecision", "decide", "needs_score", "pinned_pool", "served_model"]

AUTO_MODEL = "auto"


@dataclass(frozen=True, slots=True)
class RouteContext:
    """The facts about a request that rules may match on."""

    tenant: str
    requested_model: str
    prompt_text: str


@dataclass(frozen=True, slots=True)
class RouteDecision:
    """Where a request goes and why. `score` is None when no score was needed."""

    pool: str
    model: str
    score: float | None
    rule: str
    reason: str
    policy_version: str


def pinned_pool(policy: Policy, requested_model: str) -> str | None:
    """The pool a model name pins: a pool name, an alias, or a pool's served model name."""
    if requested_model in policy.pools:
        return requested_model
    if requested_model in policy.aliases:
        return policy.aliases[requested_model]
    for name, pool in policy.pools.items():
        served = pool.engine.served_name if pool.type == "local" else pool.model
        if served == requested_model:
            return name
    return None


def _matches(match: RuleMatch, ctx: RouteContext) -> bool:
    if match.tenants is not None and ctx.tenant not in match.tenants:
        return False
    if match.models is not None and ctx.requested_model not in match.models:
        return False
    n = len(ctx.prompt_text)
    if match.min_prompt_chars is not None and n < match.min_prompt_chars:
        return False
    if match.max_prompt_chars is not None and n > match.max_prompt_chars:
        return False
    if match.keywords is not None:
        lowered = ctx.prompt_text.lower()
        if not any(k.lower() in lowered for k in match.keywords):
            return False
    return True


def _first_rule(policy: Policy, ctx: RouteContext) -> Rule | None:
    return next((r for r in policy.routing.rules if _matches(r.match, ctx)), None)


def needs_score(policy: Policy, ctx: RouteContext) -> bool:
    """Whether deciding this request needs the classifier (pinned models and pool rules do not)."""
    if ctx.requested_model != AUTO_MODEL:
        return False
    rule = _first_rule(policy, ctx)
    return rule is None or rule.pool is None


def served_model(policy: Policy, pool: str) -> str:
    """The model name a pool's engines serve (what the gateway forwards as `model`)."""
    spec = policy.pools[pool]
    return spec.engine.served_name if spec.type == "local" else spec.model


def decide(policy: Policy, version: str, ctx: RouteContext, score: float | None) -> RouteDecision:
    """Decide the pool. The caller has checked that a pinned model exists (`pinned_pool`)."""

    def made(pool: str, rule: str, reason: str) -> RouteDecision:
        return RouteDecision(pool, served_model(policy, pool), score, rule, reason, version)

    if ctx.requested_model != AUTO_MODEL:
        pool = pinned_pool(policy, ctx.requested_model)
        assert pool is not None, "caller must reject unknown models first"
        return made(pool, "pinned", f"model {ctx.requested_model!r} pins pool {pool!r}")
    rule = _first_rule(policy, ctx)
    if rule is not None and rule.pool is not None:
        return made(rule.pool, rule.name, f"rule {rule.name!r} sends to {rule.pool!r}")
    tenant = policy.tenants.get(ctx.tenant)
    threshold = policy.routing.threshold
    name = "threshold"
    if tenant is not None and tenant.threshold is not None:
        threshold, name = tenant.threshold, "tenant-threshold"
    if rule is not None and rule.threshold is not None:
        threshold, name = rule.threshold, rule.name
    if score is None:
        return made(policy.routing.micro_pool, "no-score", "scoring disabled: default to the micro pool")
    routing = policy.routing
    pool = routing.flagship_pool if score >= threshold else routing.micro_pool
    return made(pool, name, f"score {score:.3f} {'>=' if score >= threshold else '<'} {threshold}")
