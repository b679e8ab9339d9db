"""Why a request goes where it goes: every rule tried, the rule that fired, the pool, and the route. Pure.

`explain(loaded, ctx, score)` returns an `Explanation`; `render_explanation` turns it into the text
`cascade policy explain` prints. Its route is the decision's (`policies.decide.RouteStep`: what `x-cascade-route`
shows) and the gateway's context step on the prompt's token count as `ctx` gives it (estimated from its characters
unless counted): a request too long for its pool moves to the other tier, as `gateway.serving.routing.context_fit` moves
it. Steps that depend on the pools' state while serving (on-demand fallback, failover, canary, cascade, cache, output
checks) are not shown. Computing the score (the classifier) and the engine command are the
caller's (see `gateway.cli.policy`), so this module stays free of models and processes.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.context import RouteContext
from policies.decide import (
    EmbeddingModel,
    ModelNotRouted,
    PoolNotAllowed,
    RouteDecision,
    decide,
    known_model,
    moved,
    needs_score,
    rule_trace,
)
from policies.ladder import LadderState
from policies.loader import LoadedPolicy
from policies.pools import context_of
from policies.schema import Policy
from policies.tenant_moves import other_tiers
from policies.tiers import Trade

__all__ = ["Explanation", "RuleOutcome", "explain", "render_explanation"]


@dataclass(frozen=True, slots=True)
class RuleOutcome:
    """One rule tried: `why_not` is None when it matched."""

    name: str
    target: str
    why_not: str | None


@dataclass(frozen=True, slots=True)
class Explanation:
    """A decision with its trail. `decision` is None when the request is refused (`refusal` says why)."""

    source: str
    version: str
    ctx: RouteContext
    score: float | None
    score_needed: bool
    rules: tuple[RuleOutcome, ...]
    decision: RouteDecision | None
    refusal: str | None


def explain(loaded: LoadedPolicy, ctx: RouteContext, score: float | None,
            ladder: LadderState | None = None, threshold: float | None = None, completion: int = 1,
            trade: Trade | None = None) -> Explanation:
    """Decide `ctx` under `loaded` and record each rule tried (for a named model: the rules listing it).
    `threshold` replaces the routing threshold (see `policies.decide.decide`). `completion`: the request's
    completion limit (1 where the client set none), which its pool's context must hold beside the prompt.
    `trade`: every tier's prediction for a `routing.tiers` policy (see `policies.decide.decide`)."""
    policy = loaded.policy
    trace = rule_trace(policy, ctx, score)
    rules = tuple(
        RuleOutcome(r.name, f"pool {r.pool!r}" if r.pool else f"threshold {r.threshold}", why) for r, why in trace
    )
    decision, refusal = None, None
    if not known_model(policy, ctx.requested_model):
        refusal = f"404: model {ctx.requested_model!r} is not served by this policy"
    else:
        try:
            decision = decide(policy, loaded.version, ctx, score, ladder, threshold, trade)
            decision, refusal = _fit(policy, decision, ctx, completion, ladder or LadderState())
        except PoolNotAllowed as exc:
            refusal = f"403: {exc}"
        except (ModelNotRouted, EmbeddingModel) as exc:
            refusal = f"404: {exc}"
    return Explanation(loaded.source, loaded.version, ctx, score, needs_score(policy, ctx), rules, decision, refusal)


def _fit(policy: Policy, decision: RouteDecision, ctx: RouteContext, completion: int,
         ladder: LadderState) -> tuple[RouteDecision | None, str | None]:
    """The gateway's context step on `ctx.tokens`: (decision, None), the decision moved to the other tier, or
    (None, the 400 the gateway would answer)."""
    need, context = ctx.tokens + completion, context_of(policy.pools[decision.pool])
    if context is None or need <= context:
        return decision, None
    counted = "" if ctx.prompt_tokens is not None else " (estimated)"
    size = f"{ctx.tokens} prompt tokens{counted} and {completion} completion"
    for other in other_tiers(policy, decision, ctx.tenant, ladder, False):
        room = context_of(policy.pools[other])
        if room is None or need <= room:
            why = f"{size} do not fit {decision.pool!r} ({context} tokens)"
            return moved(policy, decision, "context-fit", other, why, f"{why}: routed to {other!r}"), None
    return None, f"400: {size} do not fit in any pool that may serve this request (context_length_exceeded)"


def render_explanation(exp: Explanation, score_source: str) -> list[str]:
    """The lines `cascade policy explain` prints (without the engine command)."""
    ctx = exp.ctx
    lines = [
        f"policy:   {exp.source} (version {exp.version})",
        f"request:  tenant {ctx.tenant!r}, model {ctx.requested_model!r}, {len(ctx.prompt_text)} chars, "
        f"{ctx.tokens} tokens{'' if ctx.prompt_tokens is not None else ' (estimated)'}, "
        f"tools: {'yes' if ctx.has_tools else 'no'}, JSON format: {'yes' if ctx.json_response else 'no'}",
    ]
    shown = "none" if exp.score is None else f"{exp.score:.4f} ({score_source})"
    lines.append(f"score:    {shown}{'' if exp.score_needed else ' — not needed for this request'}")
    lines.append("rules:" if exp.rules else "rules:    (none tried)")
    for i, rule in enumerate(exp.rules, 1):
        verdict = "MATCH" if rule.why_not is None else f"no: {rule.why_not}"
        lines.append(f"  {i}. {rule.name} -> {rule.target}: {verdict}")
    if exp.decision is None:
        lines.append(f"refused:  {exp.refusal}")
        return lines
    d = exp.decision
    lines.append(f"decision: pool {d.pool!r} (model {d.model!r}), rule {d.rule!r}")
    lines.append(f"reason:   {d.reason}")
    lines.append("route:")
    lines += [f"  {i}. {step.step} -> {step.pool!r}: {step.why}" for i, step in enumerate(d.route, 1)]
    return lines + _tier_lines(d)


def _tier_lines(d: RouteDecision) -> list[str]:
    """Every tier's predicted quality (and a label memory's move of it, included) and expected cost, and the trade
    it gives (a tiers policy's decision)."""
    if d.trade is None:
        return []
    lines = [f"tiers:    predicted quality and expected cost (tradeoff {d.trade.tradeoff:g}: quality - tradeoff x USD)"]
    if d.trade.memory:
        lines.append(f"  label memory {d.trade.memory} applied (a tier it moved shows the move in brackets)")
    chosen = next((step.pool for step in d.route if step.step == "trade"), None)
    for e in d.trade.estimates:
        mark = "  <- the trade" if e.pool == chosen else ""
        moved = f" (label memory {e.memory:+.3f})" if e.memory else ""
        lines.append(f"  {e.pool}: quality {e.quality:.3f}{moved}, expected ${e.cost_usd:.6f}, "
                     f"trade {e.quality - d.trade.tradeoff * e.cost_usd:.4f}{mark}")
    return lines
