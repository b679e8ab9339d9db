"""What `cascade policy explain` predicts for each tier of a `routing.tiers` policy: the gateway's own estimates
(`gateway.serving.tier_trade`) from the shipped classifier's feature row and pool map, or qualities given with
`--quality POOL=Q,...`; the tradeoff is `--tradeoff`, else the policy's (a `cost_per_1k` policy: solved on this
request alone, as the gateway does before its window fills)."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from gateway.serving.placements import with_placements
from gateway.serving.tier_trade import map_of, tier_estimates
from policies.context import RouteContext
from policies.loader import LoadedPolicy
from policies.tiers import TierEstimate, Trade, expected_completion, expected_cost_usd, solve_tradeoff

__all__ = ["explain_trade", "given_qualities"]


def given_qualities(text: str) -> dict[str, float]:
    """argparse type of `--quality general=0.6,code=0.7`: each within [0, 1]."""
    out: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        pool, eq, value = item.partition("=")
        try:
            quality = float(value) if eq else float("nan")
        except ValueError:
            quality = float("nan")
        if not 0 <= quality <= 1:
            raise argparse.ArgumentTypeError(f"{item!r}: write POOL=Q with Q within [0, 1], e.g. general=0.62")
        out[pool.strip()] = quality
    return out


def _given(loaded: LoadedPolicy, ctx: RouteContext, qualities: dict[str, float]) -> tuple[TierEstimate, ...]:
    policy, tiers = loaded.policy, loaded.policy.routing.tiers or ()
    missing = [p for p in tiers if p not in qualities]
    if missing:
        raise ValueError(f"--quality gives no quality for tier(s) {missing}; give one per tier: {list(tiers)}")
    return tuple(TierEstimate(p, qualities[p], expected_cost_usd(policy.pools[p].price, ctx.tokens,
                                                                 expected_completion(policy, p))) for p in tiers)


def _predicted(loaded: LoadedPolicy, ctx: RouteContext, messages: Any) -> tuple[TierEstimate, ...] | None:
    """The gateway's estimates from the shipped classifier (None: it carries no pool map or keeps no row)."""
    from router_models.serving.classifier_scorer import load_scorer
    from router_models.serving.scorer import ScorerViews, read_conversation

    placed = with_placements(loaded)

    async def run() -> tuple[TierEstimate, ...] | None:
        scorer = load_scorer()
        try:
            conversation = read_conversation(messages)
            await scorer.score_one(*conversation)
            source, model = ScorerViews.of(scorer).features, map_of(scorer)
            row = None if source is None else source.features(*conversation)
            return None if row is None or model is None else tier_estimates(placed, ctx, model, row)
        finally:
            await scorer.aclose()

    return asyncio.run(run())


def explain_trade(loaded: LoadedPolicy, ctx: RouteContext, messages: Any, args: argparse.Namespace) -> Trade | None:
    """The trade `explain` decides with; None for a policy without tiers or without a prediction. Raises
    ValueError (a quality missing) or `PolicyError` (a placement that cannot be loaded)."""
    routing = loaded.policy.routing
    if not routing.tiers:
        return None
    estimates = (_given(loaded, ctx, args.quality) if args.quality is not None
                 else _predicted(loaded, ctx, messages))
    if estimates is None:
        return None
    if args.tradeoff is not None:
        if not args.tradeoff >= 0:
            raise ValueError(f"--tradeoff {args.tradeoff} is negative: it is the quality one USD of expected cost "
                             "is worth, >= 0 (0 picks the best predicted quality whatever it costs)")
        return Trade(estimates, args.tradeoff)
    if routing.cost_per_1k is not None:
        return Trade(estimates, solve_tradeoff([estimates], routing.cost_per_1k / 1e6))
    return Trade(estimates, routing.tradeoff or 0.0)
