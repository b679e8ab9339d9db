"""Nearest-rank percentiles of small in-memory windows (the ladder's, the canary guard's, `cascade pool compare`)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

__all__ = ["nearest_rank", "nearest_rank_sorted"]


def nearest_rank(values: Iterable[float], q: float) -> float:
    """The `q` quantile (0 < q <= 1) by nearest rank: the smallest value with at least `q` of them at or below it;
    NaN for no values."""
    return nearest_rank_sorted(sorted(values), q)


def nearest_rank_sorted(ordered: Sequence[float], q: float) -> float:
    """`nearest_rank` of values already in ascending order: an index, no sort (a window kept sorted)."""
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
