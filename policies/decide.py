"""Turn a request's facts and score into a `RouteDecision`. Pure: no I/O, no HTTP.

Order of a decision (each step says what it did in `reason`; `rule` names the last one that moved it):

1. a pinned model (pool name, alias or served name) picks its pool — `PoolNotAllowed` if the tenant may
   not use it; otherwise rules are tried in order and the first match wins: a `pool` rule sends there, a
   `threshold` rule (or no match: the tenant's threshold, else the routing threshold) splits by score; the
   routing threshold is the caller's live value when given (a `flagship_share` policy), else the policy's
   float or the share form's `initial` (`policies.threshold.base_threshold`);
2. an active `raise_threshold` ladder step raises that threshold (never lowers it); when that changes the
   pool, `rule` is ``ladder:<step>``;
3. a pool the tenant may not use (`allowed_pools`) becomes the first generative pool of its allowed pools
   (`PoolNotAllowed` if it has none); a pinned embedding pool is `EmbeddingModel`;
4. active `fallback_pool` / `overflow` steps move the pool's traffic (rule ``ladder:<step>``), unless the
   tenant may not use the target, in which case the request stays.

Each of these that picks or changes the pool appends a `RouteStep` to the decision's `route`: ``pinned``,
``rule:<name>`` (a rule that names a pool), ``score`` (a threshold decision; no score: the micro pool),
``trade`` (with `routing.tiers`: the best trade of predicted quality against expected cost, `policies.tiers`),
``ladder:<step>`` (a raised threshold, a pool move) and ``tenant`` (its allowed pools). The gateway's later steps
append theirs (`RouteDecision.then`): the route is what headers, records, logs and `policy explain` show.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from policies.context import AUTO_MODEL, RouteContext
from policies.ladder import LadderState
from policies.rules import Rule
from policies.schema import Policy
from policies.threshold import base_threshold
from policies.tiers import Trade, choose, estimates_text

__all__ = [
    "AUTO_MODEL",
    "EmbeddingModel",
    "ModelNotRouted",
    "PoolNotAllowed",
    "RouteContext",
    "RouteDecision",
    "RouteStep",
    "decide",
    "known_model",
    "moved",
    "needs_score",
    "pinned_pool",
    "route_text",
    "rule_models",
    "rule_trace",
    "served_model",
    "thresholds_in_use",
]


class PoolNotAllowed(Exception):
    """The tenant asked for a model whose pool its `allowed_pools` exclude (the gateway answers 403)."""

    def __init__(self, tenant: str, pool: str, allowed: tuple[str, ...]) -> None:
        self.tenant, self.pool, self.allowed = tenant, pool, allowed
        super().__init__(f"tenant {tenant!r} may not use pool {pool!r}; allowed: {list(allowed)}")


class ModelNotRouted(Exception):
    """A model name that only rules know (no pool, alias or served name), and none of those rules matches
    this request: there is no pool to send it to (the gateway answers 404)."""

    def __init__(self, model: str, rules: tuple[str, ...]) -> None:
        self.model, self.rules = model, rules
        super().__init__(f"model {model!r} is routed only by rules {list(rules)}, and none of them matches this "
                         "request")


class EmbeddingModel(Exception):
    """A generative request (chat, Responses, completions) pinned an embedding pool (`kind: embedding`), which
    serves /v1/embeddings only (the gateway answers 404, as the OpenAI API answers a model the endpoint lacks)."""

    def __init__(self, model: str, pool: str) -> None:
        self.model, self.pool = model, pool
        super().__init__(f"model {model!r} is an embedding model (pool {pool!r}): it serves /v1/embeddings only")


@dataclass(frozen=True, slots=True)
class RouteStep:
    """One step that chose or changed where a request goes: `step` names it (``score``, ``rule:<name>``,
    ``context-fit``, ``failover``, ...), `pool` is the pool after it, `why` says why in a few words. Never prompt
    text: only names, numbers and sizes."""

    step: str
    pool: str
    why: str

    def __str__(self) -> str:
        return f"{self.step}:{self.pool}"


def route_text(route: tuple[RouteStep, ...]) -> str:
    """The steps as the `x-cascade-route` header and the cost record show them: "score:micro, context-fit:flagship"
    (each step's pool after its last ":")."""
    return ", ".join(str(step) for step in route)


@dataclass(frozen=True, slots=True)
class RouteDecision:
    """Where a request goes and why. `score` is None when no score was needed; `scored_by` names the model
    that gave it (`router_models.serving.scorer.Scorer.score_one`; "" without a score) and `router_version`
    the artifact (`Scorer.version`). `pool_version` is the engine version that serves it (`policies.pools.
    engine_version`: the pool's, or its canary's), set once the gateway has split the pool's traffic."""

    pool: str
    model: str
    score: float | None
    rule: str
    reason: str
    policy_version: str
    scored_by: str = ""
    router_version: str = ""
    pool_version: str = ""
    route: tuple[RouteStep, ...] = ()  # every step that chose or changed the pool, in order (`RouteStep`)
    in_domain: float | None = None  # how close the request is to the router's training data (`router_models.
    # serving.domain`), None without a figure (not scored, the overflow model scored it, no domain reference)
    trade: Trade | None = None  # with routing.tiers: every tier's predicted quality and expected cost, and the
    # tradeoff in force (`policies.tiers`); None without tiers or without a prediction

    def then(self, step: str, why: str, **changes: Any) -> RouteDecision:
        """This decision after one more step: `changes` (pool, model, rule, reason, ...) applied, and `step` with
        the pool after it and `why` appended to `route`."""
        return replace(self, route=(*self.route, RouteStep(step, changes.get("pool", self.pool), why)), **changes)


def moved(policy: Policy, decision: RouteDecision, step: str, pool: str, why: str, reason: str) -> RouteDecision:
    """`decision` sent to `pool` by `step`: its model the pool's, its rule the step's name, `reason` added to its
    reason, and the step in its route."""
    return decision.then(step, why, pool=pool, model=served_model(policy, pool), rule=step,
                         reason=f"{decision.reason}; {reason}")


def pinned_pool(policy: Policy, requested_model: str) -> str | None:
    """The pool a model name pins: a pool name, an alias, or a pool's served model name."""
    if requested_model in policy.pools:
        return requested_model
    if requested_model in policy.aliases:
        return policy.aliases[requested_model]
    for name in policy.pools:
        if served_model(policy, name) == requested_model:
            return name
    return None


def served_model(policy: Policy, pool: str) -> str:
    """The model name a pool's engines serve (what the gateway forwards as `model`)."""
    spec = policy.pools[pool]
    return spec.engine.served_name if spec.type == "local" else spec.model


def rule_trace(policy: Policy, ctx: RouteContext, score: float | None) -> list[tuple[Rule, str | None]]:
    """Each rule tried, in order, with why it did not match (None: it matched); stops at the first match.
    For a named model only the rules listing it in `match.models` are tried (see `_model_rule`)."""
    named = ctx.requested_model != AUTO_MODEL
    trace: list[tuple[Rule, str | None]] = []
    for rule in policy.routing.rules:
        if named and ctx.requested_model not in (rule.match.models or ()):
            continue
        why = rule.match.why_not(ctx, score)
        trace.append((rule, why))
        if why is None:
            break
    return trace


def rule_models(policy: Policy) -> list[str]:
    """Model names that only rules route (listed in some rule's `match.models`, not a pool or alias)."""
    names = {m for r in policy.routing.rules for m in (r.match.models or ())}
    return sorted(n for n in names if n != AUTO_MODEL and pinned_pool(policy, n) is None)


def known_model(policy: Policy, name: str) -> bool:
    """Whether `name` may be requested: "auto", a pool, an alias, a served model name, or a rule's model."""
    return name == AUTO_MODEL or pinned_pool(policy, name) is not None or name in rule_models(policy)


def _model_rule(policy: Policy, ctx: RouteContext, score: float | None, check_score: bool = True) -> Rule | None:
    """For a named model: the first rule that lists it in `match.models` and matches. Such rules come
    before pinning, so ops can re-route an alias (or a name no pool serves) without touching clients."""
    for rule in policy.routing.rules:
        listed = ctx.requested_model in (rule.match.models or ())
        if listed and rule.match.why_not(ctx, score, check_score=check_score) is None:
            return rule
    return None


def needs_score(policy: Policy, ctx: RouteContext) -> bool:
    """Whether deciding this request needs the classifier: an `auto` request that reaches a rule with a
    score range, a threshold rule, or no rule; a named model whose model rule needs one. Pinned models
    and `pool` rules before those do not."""
    if ctx.requested_model != AUTO_MODEL:
        rule = _model_rule(policy, ctx, None, check_score=False)
        return rule is not None and (rule.match.has_score_range or rule.pool is None)
    for rule in policy.routing.rules:
        if rule.match.why_not(ctx, None, check_score=False) is not None:
            continue
        return rule.match.has_score_range or rule.pool is None
    return True


def _allowed(policy: Policy, tenant: str) -> tuple[str, ...] | None:
    spec = policy.tenants.get(tenant)
    return None if spec is None else spec.allowed_pools


Base = tuple[str, str, str, tuple[RouteStep, ...]]
"""(pool, rule, reason, route) of the first part of a decision (`_base`)."""


def _by_score(policy: Policy, ctx: RouteContext, rule: Rule | None, score: float | None,
              ladder: LadderState, live: float | None) -> Base:
    """(pool, rule, reason, route) of a threshold decision, with the ladder's raised threshold applied."""
    routing = policy.routing
    tenant = policy.tenants.get(ctx.tenant)
    threshold, name = (base_threshold(routing.threshold) if live is None else live), "threshold"
    if tenant is not None and tenant.threshold is not None:
        threshold, name = tenant.threshold, "tenant-threshold"
    if rule is not None and rule.threshold is not None:
        threshold, name = rule.threshold, rule.name
    if score is None:
        why = "no score: the micro pool"
        return routing.micro_pool, "no-score", "no score: default to the micro pool", (
            RouteStep("score", routing.micro_pool, why),)
    pool = routing.flagship_pool if score >= threshold else routing.micro_pool
    reason = f"score {score:.3f} {'>=' if score >= threshold else '<'} {threshold}"
    scored = (RouteStep("score", pool, f"{reason} ({name})"),)
    if ladder.threshold is None or ladder.threshold <= threshold:
        return pool, name, reason, scored
    raised = routing.flagship_pool if score >= ladder.threshold else routing.micro_pool
    note = f"ladder step {ladder.threshold_step!r} raised the threshold {threshold} -> {ladder.threshold}"
    if raised == pool:
        return pool, name, f"{reason}; {note} (same pool)", scored
    step = f"ladder:{ladder.threshold_step}"
    return raised, step, f"{reason} ({name}); {note}: score {score:.3f} < it", (
        *scored, RouteStep(step, raised, f"threshold raised to {ladder.threshold}"))


def thresholds_in_use(policy: Policy, live: float | None, ladder: LadderState) -> tuple[float, ...]:
    """Every threshold `_by_score` may compare a score of `policy` with: the routing threshold (`live` when given),
    each tenant's and each rule's own, and the one an active ladder step raises it to; sorted, each once. What a
    two-stage scorer refines around: one band for every request it batches, whatever tenant or rule reads it."""
    found = {base_threshold(policy.routing.threshold) if live is None else live}
    found.update(t.threshold for t in policy.tenants.values() if t.threshold is not None)
    found.update(r.threshold for r in policy.routing.rules if r.threshold is not None)
    if ladder.threshold is not None:
        found.add(ladder.threshold)
    return tuple(sorted(found))


def _sent_by(rule: Rule, pool: str) -> Base:
    return pool, rule.name, f"rule {rule.name!r} sends to {pool!r}", (RouteStep(f"rule:{rule.name}", pool, "matched"),)


def _traded(policy: Policy, ctx: RouteContext, trade: Trade) -> Base:
    """(pool, rule, reason, route) of a tiers decision: the best trade among the tiers the tenant may use (all of
    them when it may use none: its allowed pools then move the request, as for any decision)."""
    allowed = _allowed(policy, ctx.tenant)
    usable = [e for e in trade.estimates if allowed is None or e.pool in allowed] or list(trade.estimates)
    best = choose(usable, trade.tradeoff)
    why = f"best trade at tradeoff {trade.tradeoff:g} among {len(usable)} tier(s): {estimates_text(usable)}"
    if trade.memory:
        why += f" (label memory {trade.memory} applied)"
    reason = (f"predicted quality {best.quality:.3f} at expected ${best.cost_usd:.6f} on {best.pool!r} "
              f"(tradeoff {trade.tradeoff:g})")
    return best.pool, "trade", reason, (RouteStep("trade", best.pool, why),)


def _base(policy: Policy, ctx: RouteContext, score: float | None, ladder: LadderState, live: float | None,
          trade: Trade | None = None) -> Base:
    model_rule = _model_rule(policy, ctx, score) if ctx.requested_model != AUTO_MODEL else None
    if model_rule is not None:
        if model_rule.pool is not None:
            return _sent_by(model_rule, model_rule.pool)
        return _by_score(policy, ctx, model_rule, score, ladder, live)
    if ctx.requested_model != AUTO_MODEL:
        pool = pinned_pool(policy, ctx.requested_model)
        if pool is None:
            raise ModelNotRouted(ctx.requested_model, tuple(r.name for r, _ in rule_trace(policy, ctx, score)))
        allowed = _allowed(policy, ctx.tenant)
        if allowed is not None and pool not in allowed:
            raise PoolNotAllowed(ctx.tenant, pool, allowed)
        if policy.pools[pool].kind == "embedding":
            raise EmbeddingModel(ctx.requested_model, pool)
        return pool, "pinned", f"model {ctx.requested_model!r} pins pool {pool!r}", (
            RouteStep("pinned", pool, "the requested model names it"),)
    trace = rule_trace(policy, ctx, score)
    rule = trace[-1][0] if trace and trace[-1][1] is None else None
    if rule is not None and rule.pool is not None:
        return _sent_by(rule, rule.pool)
    tenant = policy.tenants.get(ctx.tenant)
    if trade is not None and rule is None and (tenant is None or tenant.threshold is None):
        return _traded(policy, ctx, trade)
    return _by_score(policy, ctx, rule, score, ladder, live)


def decide(
    policy: Policy, version: str, ctx: RouteContext, score: float | None, ladder: LadderState | None = None,
    threshold: float | None = None, trade: Trade | None = None,
) -> RouteDecision:
    """Decide the pool (see the module docstring for the order). `threshold` replaces the routing threshold
    (the gateway's live value for a `flagship_share` policy); tenant and rule thresholds still take precedence.
    `trade`: every tier's prediction for this request (a `routing.tiers` policy with a pool map): an `auto`
    request that no rule sends, of a tenant without its own threshold, goes to the best trade (step ``trade``)
    instead of the threshold split; without it a tiers policy splits by score between its first and last tier.
    The caller has checked that the model is known (`known_model`). Raises `PoolNotAllowed` for a pinned pool
    the tenant may not use, and `ModelNotRouted` for a rule-only model name none of whose rules matches."""
    ladder = ladder or LadderState()
    pool, rule, reason, route = _base(policy, ctx, score, ladder, threshold, trade)
    allowed = _allowed(policy, ctx.tenant)
    if allowed is not None and pool not in allowed:
        first = next((p for p in allowed if policy.pools[p].kind == "generative"), None)
        if first is None:  # the tenant may use embedding pools only
            raise PoolNotAllowed(ctx.tenant, pool, allowed)
        reason += f"; tenant {ctx.tenant!r} may not use {pool!r}: sent to {first!r} (first allowed pool)"
        route += (RouteStep("tenant", first, f"may not use {pool!r}: its first allowed pool"),)
        pool = first
    target, steps = ladder.route(pool)
    if steps and allowed is not None and target not in allowed:
        reason += f"; ladder step {steps[-1]!r} would move it to {target!r}, which tenant {ctx.tenant!r} may not use"
    elif steps:
        rule, reason = f"ladder:{steps[-1]}", f"{reason}; ladder step(s) {list(steps)} move {pool!r} -> {target!r}"
        route += (RouteStep(rule, target, f"{' then '.join(steps)} moves {pool!r}"),)
        pool = target
    return RouteDecision(pool, served_model(policy, pool), score, rule, reason, version, route=route,
                         trade=trade if policy.routing.tiers else None)
