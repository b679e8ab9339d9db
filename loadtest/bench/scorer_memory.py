"""A label memory of real labels attached to a benchmarked scorer, moving each score as the gateway does.

The gateway moves a routed request's score by its tenant's label memory right after scoring it: it reads the feature
row the scorer kept (`ClassifierScorer.features`) and calls `MemoryRouter.adjust` on it (inline, on the event loop,
for a memory of up to `label_memories.INLINE_LABELS` labels). `with_memory` wraps a bench's `score_one` the same
way, with a memory of `labels` real labels (`router_models.training.outcomes.load_outcomes`: real prompts and
their real outcomes from `../shared/data/routing`, evenly spread over the default sources), embedded by the
scorer's own model. For timing only: the labels' quality is not measured here.

Works with an older tree's `router_models` too (the tree whose scorer is benchmarked: `scorer_variants`): every
import is made when called, from whatever `router_models` is on the path.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

__all__ = ["SHARED_POOLS", "attach_memory", "tier_placements", "with_memory"]

# Pools placed as shared sources' models, cheapest first, the flagship last: the first two and the last are the
# shipped three-pool example's (`policies/examples/three-pools.yaml`: general, code, flagship). `--tiers N` takes the
# first N - 1 and the flagship; `pool_map_cost` places from the same list.
SHARED_POOLS = ("routerbench/mistralai/mistral-7b-chat", "routerbench/meta/code-llama-instruct-34b-chat",
                "routerbench/mistralai/mixtral-8x7b-chat", "routerbench/claude-v2", "routerbench/gpt-4-1106-preview")


def attach_memory(scorer: Any, labels: int) -> Any:
    """A `MemoryRouter` of `labels` real labels on `scorer`'s router (None when `labels` is 0). Takes seconds
    (every label is embedded as the scorer embeds a request)."""
    if labels <= 0:
        return None
    import numpy as np

    from loadtest.bench.scorer_prompts import DEFAULT_DATA_DIR
    from router_models.serving.label_memory import LabelMemory, MemoryParams, MemoryRouter, gap_target
    from router_models.training.outcomes import load_outcomes

    examples = load_outcomes(Path(os.environ.get("CASCADE_ROUTING_DATA", DEFAULT_DATA_DIR)))
    picked = [examples[int(i)] for i in np.linspace(0, len(examples) - 1, labels).round()]
    model = scorer._model  # the primary model: the feature rows the gateway's memory reads
    rows, dims = [], 0
    for ex in picked:  # one text a call, as the scorer serves it
        _, vector, structure = model.score_and_features([ex.text], [ex.shape] if ex.shape else None)
        rows.append(np.hstack([vector, structure]))
        dims = vector.shape[1]
    x = np.vstack(rows).astype(np.float32)
    memory = LabelMemory.empty(x.shape[1], dims, MemoryParams()).extended(
        x, np.asarray([gap_target(ex.weak, ex.strong) for ex in picked], np.float64), [ex.key for ex in picked])
    return MemoryRouter.attach(model.router, memory)


def tier_placements(scorer: Any, tiers: int) -> tuple[Any, list[Any]] | None:
    """(the pool map the scorer carries, `tiers` pools placed on it from the shared sources' models: the three-pool
    example's, then more before the flagship); None for 0 tiers, or for a tree whose scorer carries no map (an
    older tree: the bench then measures it without, and says so)."""
    if tiers <= 0:
        return None
    pool_map = getattr(scorer, "pool_map", None)
    if pool_map is None:
        print("tiers: this tree's scorer carries no pool map; measured without it", flush=True)
        return None
    from router_models.serving.placement import place_from_shared

    models = [*SHARED_POOLS[:-1][: tiers - 1], SHARED_POOLS[-1]]  # at most 5
    return pool_map, [place_from_shared(pool_map, m) for m in models]


def with_memory(scorer: Any, attached: Any, tiers: int = 0) -> Callable[[str], Awaitable[float]]:
    """`score_one(text)` for the bench: the scorer's score of the plain prompt `text`, moved by `attached` from the
    feature row the scorer kept (as the gateway does inline); the plain score when `attached` is None. With `tiers`,
    each request also gets its predicted quality on that many pools (at most 5) from the same row
    (`pool_map.quality`, as the gateway's `tier_trade.tier_estimates` does on the event loop for a `routing.tiers`
    policy)."""
    import numpy as np

    mapped = tier_placements(scorer, tiers)
    if mapped is not None:
        from router_models.serving.pool_map import quality

    async def score_one(text: str) -> float:
        score, scored_by = await scorer.score_one(text)
        if (attached is None and mapped is None) or scored_by != "primary":
            return float(score)
        row = scorer.features(text)
        if row is None:
            return float(score)
        if mapped is not None:
            quality(mapped[0], row[None, :], mapped[1])
        if attached is None:
            return float(score)
        return float(attached.adjust(row[None, :], np.asarray([score]))[0])

    return score_one
