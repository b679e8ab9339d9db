"""Why a request goes where it goes: every rule tried, the rule that fired, the pool. Pure.

`explain(loaded, ctx, score)` returns an `Explanation`; `render_explanation` turns it into the text
`cascade policy explain` prints. Computing the score (the classifier) and the engine command are the
caller's (see `gateway.cli.policy`), so this module stays free of models and processes.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.context import RouteContext
from policies.decide import (
    ModelNotRouted,
    PoolNotAllowed,
    RouteDecision,
    decide,
    known_model,
    needs_score,
    rule_trace,
)
from policies.ladder import LadderState
from policies.loader import LoadedPolicy

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
            ladder: LadderState | None = None, threshold: float | None = None) -> Explanation:
    """Decide `ctx` under `loaded` and record each rule tried (for a named model: the rules listing it).
    `threshold` replaces the routing threshold (see `policies.decide.decide`)."""
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
            decision = decide(policy, loaded.version, ctx, score, ladder, threshold)
        except PoolNotAllowed as exc:
            refusal = f"403: {exc}"
        except ModelNotRouted as exc:
            refusal = f"404: {exc}"
    return Explanation(loaded.source, loaded.version, ctx, score, needs_score(policy, ctx), rules, decision, refusal)


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
    return lines
