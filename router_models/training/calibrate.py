"""Routing thresholds from a sample of scores: for a target flagship share or a cost per 1,000 requests.

Pure numpy. A request goes to the flagship when ``score >= threshold``. On a sample, a threshold can only
split it between two distinct scores (requests with equal scores go together), so each function picks among
the achievable cuts "the top k scores go to the flagship" and returns the threshold of that cut:

- k = 0: 1.0 (only a score of exactly 1.0 would go; a sample holding 1.0 cannot send none);
- k = n: 0.0 (everything goes);
- otherwise the midpoint between the k-th and (k+1)-th highest scores (or the k-th itself where floating
  point leaves no room between them), so small drifts in traffic do not flip requests at the boundary.

Money is integer micro-USD: per-request costs come in as integers, the cost per 1,000 requests is rounded
half up to an integer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

__all__ = ["Calibration", "CalibrationError", "cost_per_1k", "cost_threshold", "share_threshold", "shown_threshold"]


class CalibrationError(ValueError):
    """The sample or the target cannot give a threshold (empty sample, target out of range or unreachable)."""


@dataclass(frozen=True, slots=True)
class Calibration:
    """A threshold and what it does on the sample it was fitted on."""

    threshold: float
    flagship_share: float  # share of the sample with score >= threshold
    flagship_requests: int
    requests: int


def _sorted_desc(scores: Sequence[float] | NDArray[np.float64]) -> NDArray[np.float64]:
    values = np.asarray(scores, dtype=np.float64)
    if values.size == 0:
        raise CalibrationError("no scores to calibrate on")
    if not np.all(np.isfinite(values)) or values.min() < 0 or values.max() > 1:
        raise CalibrationError("scores must be finite numbers within [0, 1]")
    return np.sort(values)[::-1]


def _cuts(desc: NDArray[np.float64]) -> NDArray[np.int64]:
    """The achievable k (top-k to the flagship), ascending: 0 unless the top score is 1.0, n, and every k
    that falls between two distinct scores."""
    n = desc.size
    inner = np.nonzero(desc[:-1] > desc[1:])[0] + 1
    head = [0] if desc[0] < 1.0 else []
    return np.unique(np.concatenate([np.asarray(head, np.int64), inner.astype(np.int64), [n]]))


def _threshold_of(desc: NDArray[np.float64], k: int) -> float:
    if k == 0:
        return 1.0
    if k == desc.size:
        return 0.0
    above, below = float(desc[k - 1]), float(desc[k])
    mid = (above + below) / 2
    return mid if below < mid <= above else above


def _result(desc: NDArray[np.float64], k: int) -> Calibration:
    return Calibration(_threshold_of(desc, k), k / desc.size, k, int(desc.size))


def share_threshold(scores: Sequence[float] | NDArray[np.float64], share: float) -> Calibration:
    """The threshold whose flagship share on `scores` is closest to `share` (in [0, 1]); on a tie between two
    cuts, the one sending fewer requests to the flagship. Raises `CalibrationError`."""
    if not 0 <= share <= 1:
        raise CalibrationError(f"flagship share must be within [0, 1], got {share}")
    desc = _sorted_desc(scores)
    cuts = _cuts(desc)
    k = int(cuts[int(np.argmin(np.abs(cuts - share * desc.size)))])  # argmin takes the first (smaller) k on ties
    return _result(desc, k)


def _cumulative_costs(desc_order: NDArray[np.int64], micro: NDArray[np.int64],
                      flagship: NDArray[np.int64]) -> NDArray[np.int64]:
    """Total cost (micro-USD) when the top k go to the flagship, for k = 0..n."""
    extra = (flagship - micro)[desc_order]
    return np.concatenate([[0], np.cumsum(extra)]).astype(np.int64) + int(micro.sum())


def cost_per_1k(total_micro_usd: int, requests: int) -> int:
    """Cost per 1,000 requests in micro-USD, rounded half up."""
    return (total_micro_usd * 2000 + requests) // (2 * requests)


def cost_threshold(scores: Sequence[float] | NDArray[np.float64], micro_cost: Sequence[int],
                   flagship_cost: Sequence[int], target_per_1k_micro_usd: int) -> tuple[Calibration, int]:
    """The lowest threshold (most flagship traffic) whose cost per 1,000 requests on the sample is at most
    the target, with that cost in micro-USD. `micro_cost[i]` and `flagship_cost[i]` are request i's cost on
    each pool. Raises `CalibrationError` when even the cheapest achievable cut costs more than the target."""
    if target_per_1k_micro_usd < 0:
        raise CalibrationError(f"cost target must be >= 0, got {target_per_1k_micro_usd} micro-USD")
    values = np.asarray(scores, dtype=np.float64)
    micro, flagship = np.asarray(micro_cost, np.int64), np.asarray(flagship_cost, np.int64)
    if not values.size == micro.size == flagship.size:
        raise CalibrationError("scores and costs must have one entry per request")
    desc = _sorted_desc(values)
    order = np.argsort(-values, kind="stable")
    totals = _cumulative_costs(order, micro, flagship)
    cuts = _cuts(desc)
    per_1k = np.asarray([cost_per_1k(int(totals[k]), desc.size) for k in cuts])
    fitting = cuts[per_1k <= target_per_1k_micro_usd]
    if fitting.size == 0:
        raise CalibrationError(f"the target is below the cheapest threshold's cost per 1k requests "
                               f"({int(per_1k.min())} micro-USD)")
    k = int(fitting.max())
    return _result(desc, k), cost_per_1k(int(totals[k]), desc.size)


def shown_threshold(scores: Sequence[float] | NDArray[np.float64], threshold: float) -> str:
    """`threshold` as short text (4, then 6 decimals, then in full) that splits `scores` exactly as it does."""
    values = np.asarray(scores, dtype=np.float64)
    flagship = int(np.count_nonzero(values >= threshold))
    for text in (f"{threshold:.4f}", f"{threshold:.6f}", repr(threshold)):
        if int(np.count_nonzero(values >= float(text))) == flagship:
            return text.rstrip("0").rstrip(".") if "." in text and "e" not in text else text
    return repr(threshold)
