"""Every tier's predicted quality and expected cost for one routed request (a `routing.tiers` policy).

Contract:
- Quality comes from the pool map (`QualityModel`: `router_models.serving.pool_map.quality`) on the feature row
  the scorer kept when it scored the request (`router_models.serving.scorer.FeatureSource`: nothing is computed
  again) and each tier's placement, loaded with the policy (`LoadedPolicy.placements`).
- Expected cost is each tier's prices times the request's prompt tokens (`RouteContext.tokens`: counted, or
  estimated from its characters) and the tier's expected completion tokens (`policies.tiers`).
- No prediction (no pool map, a request not scored by the primary model, a row the scorer no longer keeps, a
  map that fails): None, and the policy splits by score between its first and last tier, as without a map. A
  failing map is logged, never fails the request.
- The map is a few multiply-adds per tier on one row: it runs on the event loop, unlike the embedding.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from policies.context import RouteContext
from policies.loader import LoadedPolicy
from policies.tiers import TierEstimate, expected_completion, expected_cost_usd
from router_models.serving.pool_map import PoolMap, quality

__all__ = ["MapQuality", "QualityModel", "map_of", "tier_estimates"]

log = logging.getLogger("cascade.router")


class QualityModel(Protocol):
    """P(good answer) of each placement for each feature row."""

    def quality(self, features: npt.NDArray[np.float32], placements: Sequence[Any]) -> npt.NDArray[np.float64]:
        """`features` [n, d] -> [n, len(placements)], each in [0, 1]."""
        ...


class MapQuality:
    """The pool map's prediction (`router_models.serving.pool_map.quality(pool_map, features, placements)`)."""

    def __init__(self, pool_map: PoolMap) -> None:
        self._map = pool_map

    def quality(self, features: npt.NDArray[np.float32], placements: Sequence[Any]) -> npt.NDArray[np.float64]:
        return quality(self._map, features, list(placements))


def map_of(scorer: object) -> QualityModel | None:
    """The pool map a scorer carries (the classifier's `pool_map`, on its own feature rows: `router_models.serving.
    pool_map.pool_map_for`), as a `QualityModel`; None when it carries none."""
    pool_map = getattr(scorer, "pool_map", None)
    return MapQuality(pool_map) if isinstance(pool_map, PoolMap) else None


def tier_estimates(loaded: LoadedPolicy, ctx: RouteContext, model: QualityModel,
                   row: npt.NDArray[np.float32]) -> tuple[TierEstimate, ...] | None:
    """Every tier's estimate for the request `ctx` whose feature row is `row` (see the module docstring)."""
    policy = loaded.policy
    tiers = policy.routing.tiers or ()
    try:
        predicted = model.quality(row.reshape(1, -1), [loaded.placements[p] for p in tiers])[0]
    except Exception:
        log.exception("the pool map did not predict; tiers split by score")
        return None
    if len(predicted) != len(tiers) or not all(math.isfinite(q) and 0 <= q <= 1 for q in predicted):
        log.error("the pool map predicted %s for %d tiers: not a probability per tier; tiers split by score",
                  list(predicted), len(tiers))
        return None
    return tuple(TierEstimate(pool, float(q), expected_cost_usd(policy.pools[pool].price, ctx.tokens,
                                                                expected_completion(policy, pool)))
                 for pool, q in zip(tiers, predicted, strict=True))
