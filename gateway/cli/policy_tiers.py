"""What `cascade policy explain` predicts for each tier of a `routing.tiers` policy: the gateway's own estimates
(`gateway.serving.routing.tier_trade`) from the shipped classifier's feature row and pool map, or qualities given with
`--quality POOL=Q,...`; the tradeoff is `--tradeoff`, else the policy's (a `cost_per_1k` policy: solved on this
request alone, as the gateway does before its window fills).

The predicted estimates are moved by the label memory the gateway would apply (`gateway.serving.routing.label_memories`:
the policy's `learning.label_memory.scope` for `--tenant`, or `--memory NAME`), read from `--store` (default: the
served store), exactly as the gateway's router moves them (`LabelMemories.adjust`, then `move_tiers`); each tier's
move shows beside its quality. Which memory, and the score's move: `gateway.cli.policy_memory`."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from gateway.cli.policy_memory import memory_folder, memory_name
from gateway.serving.routing.placements import with_placements
from gateway.serving.routing.tier_trade import map_of, tier_estimates
from policies.context import RouteContext
from policies.loader import LoadedPolicy
from policies.schema import Policy
from policies.tiers import TierEstimate, Trade, expected_completion, expected_cost_usd, solve_tradeoff

_Predicted = tuple[tuple[TierEstimate, ...], str]  # the estimates, and the label memory that moved them ("": none)

__all__ = ["explain_trade", "given_qualities", "offline_tradeoff_note"]


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


def _predicted(loaded: LoadedPolicy, ctx: RouteContext, messages: Any, args: argparse.Namespace) -> _Predicted | None:
    """The gateway's estimates from the shipped classifier, moved by the label memory it would apply (module
    docstring); None: it carries no pool map or keeps no row."""
    from gateway.serving.routing.label_memories import LabelMemories
    from router_models.serving.classifier_scorer import load_scorer
    from router_models.serving.scorer import ScorerViews, read_conversation

    placed = with_placements(loaded)
    given = getattr(args, "memory", None)
    name = memory_name(loaded, ctx.tenant, given)
    folder = None if name is None else memory_folder(getattr(args, "store", None), name, given is not None)

    async def run() -> _Predicted | None:
        scorer = load_scorer()
        try:
            conversation = read_conversation(messages)
            score, _ = await scorer.score_one(*conversation)
            views, model = ScorerViews.of(scorer), map_of(scorer)
            row = None if views.features is None else views.features.features(*conversation)
            estimates = None if row is None or model is None else tier_estimates(placed, ctx, model, row)
            if estimates is None or row is None or model is None or folder is None or name is None:
                return None if estimates is None else (estimates, "")
            memories = LabelMemories(folder, lambda: scorer)
            await memories.refresh()
            text, shape = conversation
            memory = memories.adjust(name, views, text, score, shape)
            if memory is None:
                return estimates, ""
            tiers = placed.policy.routing.tiers or ()
            moved = await memories.move_tiers(memory, estimates, row, tuple(placed.placements[p] for p in tiers),
                                              model)
            return moved, f"{memory.name}@{memory.labels}"
        finally:
            await scorer.aclose()

    return asyncio.run(run())


def explain_trade(loaded: LoadedPolicy, ctx: RouteContext, messages: Any, args: argparse.Namespace) -> Trade | None:
    """The trade `explain` decides with; None for a policy without tiers or without a prediction. Raises
    ValueError (a quality missing) or `PolicyError` (a placement that cannot be loaded)."""
    routing = loaded.policy.routing
    if not routing.tiers:
        return None
    found = (_given(loaded, ctx, args.quality), "") if args.quality is not None else _predicted(loaded, ctx,
                                                                                                messages, args)
    if found is None:
        return None
    estimates, memory = found
    if args.tradeoff is not None:
        if not args.tradeoff >= 0:
            raise ValueError(f"--tradeoff {args.tradeoff} is negative: it is the quality one USD of expected cost "
                             "is worth, >= 0 (0 picks the best predicted quality whatever it costs)")
        return Trade(estimates, args.tradeoff, memory)
    if routing.cost_per_1k is not None:
        return Trade(estimates, solve_tradeoff([estimates], routing.cost_per_1k / 1e6), memory)
    return Trade(estimates, routing.tradeoff or 0.0, memory)


def offline_tradeoff_note(name: str, policy: Policy, given: float | None) -> str | None:
    """What `explain` trades `name`'s `cost_per_1k` policy with when it does not ask a gateway (None: not such a
    policy, or `--tradeoff` given): each request solved alone, which a gateway does only until its window fills."""
    target = policy.routing.cost_per_1k
    if target is None or not policy.routing.tiers or given is not None:
        return None
    return (f"{name}: routing.cost_per_1k holds ${target / 1e6:.2f} per 1,000 requests, which the gateway turns into "
            "a live tradeoff over its latest trades; used here: solved on this request alone (pass --tradeoff to try "
            "another; --gateway URL (or --redis-url URL --prefix P): the tradeoff a running gateway uses)")
