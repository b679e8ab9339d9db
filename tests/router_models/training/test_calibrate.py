"""Threshold calibration math: share and cost targets, ties, tiny samples, bad input."""

from __future__ import annotations

import numpy as np
import pytest

from router_models.training.calibrate import (
    CalibrationError,
    cost_per_1k,
    cost_threshold,
    share_threshold,
    shown_threshold,
)


def _share_of(scores: list[float], threshold: float) -> float:
    return sum(s >= threshold for s in scores) / len(scores)


def test_share_threshold_hits_the_target_on_distinct_scores() -> None:
    scores = list(np.linspace(0.0, 0.99, 100))
    cal = share_threshold(scores, 0.3)
    assert cal.flagship_requests == 30 and cal.requests == 100
    assert _share_of(scores, cal.threshold) == pytest.approx(0.3)
    # the midpoint between the 30th and 31st highest scores
    desc = sorted(scores, reverse=True)
    assert cal.threshold == pytest.approx((desc[29] + desc[30]) / 2)


def test_ties_move_together_and_the_closest_cut_wins() -> None:
    scores = [0.9, 0.5, 0.5, 0.5, 0.1]  # cuts: 0, 1, 4, 5
    cal = share_threshold(scores, 0.4)  # 2 of 5 wanted; k=1 (0.2) is closer than k=4 (0.8)
    assert cal.flagship_requests == 1 and _share_of(scores, cal.threshold) == pytest.approx(0.2)
    cal = share_threshold(scores, 0.7)  # 3.5 wanted: k=4 is closer than k=1
    assert cal.flagship_requests == 4 and _share_of(scores, cal.threshold) == pytest.approx(0.8)


def test_equal_distance_prefers_fewer_flagship_requests() -> None:
    assert share_threshold([0.2, 0.8], 0.5).flagship_requests == 1
    assert share_threshold([0.2, 0.4, 0.6, 0.8], 0.5).flagship_requests == 2
    cal = share_threshold([0.7, 0.7, 0.3, 0.3, 0.1, 0.1], 0.5)  # 3 wanted: k=2 and k=4 tie, k=2 wins
    assert cal.flagship_requests == 2


def test_tiny_samples_and_extremes() -> None:
    one = share_threshold([0.4], 0.5)
    assert one.flagship_requests == 0 and one.threshold == 1.0
    assert share_threshold([0.4], 1.0).threshold == 0.0
    assert share_threshold([0.2, 0.3], 0.0).threshold == 1.0
    # a sample holding 1.0 cannot send nothing to the flagship: the smallest cut takes the 1.0 scores
    top = share_threshold([1.0, 1.0, 0.2], 0.0)
    assert top.flagship_requests == 2 and _share_of([1.0, 1.0, 0.2], top.threshold) == pytest.approx(2 / 3)
    same = share_threshold([0.5] * 10, 0.3)  # all tied: nothing or everything; nothing is closer
    assert same.flagship_requests == 0


def test_adjacent_floats_keep_the_split() -> None:
    a = 0.5
    b = float(np.nextafter(a, 0))
    cal = share_threshold([a, b], 0.5)
    assert cal.flagship_requests == 1 and a >= cal.threshold > b


@pytest.mark.parametrize("bad", [[], [float("nan")], [-0.1], [1.2]])
def test_bad_scores_are_refused(bad: list[float]) -> None:
    with pytest.raises(CalibrationError):
        share_threshold(bad, 0.3)


@pytest.mark.parametrize("share", [-0.1, 1.5])
def test_share_out_of_range_is_refused(share: float) -> None:
    with pytest.raises(CalibrationError, match="within"):
        share_threshold([0.1, 0.2], share)


def test_cost_threshold_spends_up_to_the_target() -> None:
    scores = [0.9, 0.7, 0.5, 0.3, 0.1]
    micro = [10, 10, 10, 10, 10]
    flagship = [100, 100, 100, 100, 100]
    # all micro: 50 per 5 requests = 10_000 per 1k; each flagship request adds 18_000 per 1k
    assert cost_threshold(scores, micro, flagship, 10_000)[0].flagship_requests == 0
    cal, per_1k = cost_threshold(scores, micro, flagship, 47_000)
    assert cal.flagship_requests == 2 and per_1k == 46_000
    assert 0.5 < cal.threshold < 0.7
    everything, per_1k = cost_threshold(scores, micro, flagship, 10**9)
    assert everything.threshold == 0.0 and per_1k == 100_000


def test_cost_threshold_uses_each_requests_own_cost() -> None:
    scores = [0.9, 0.8, 0.1]
    micro = [1, 1, 1]
    flagship = [1000, 2, 2]  # the top request is the expensive one
    cal, per_1k = cost_threshold(scores, micro, flagship, cost_per_1k(1000 + 1 + 1, 3))
    assert cal.flagship_requests == 1 and per_1k == cost_per_1k(1002, 3)
    cal, _ = cost_threshold(scores, micro, flagship, cost_per_1k(1001, 3))  # just below: none fits but k=0
    assert cal.flagship_requests == 0


def test_cost_target_below_all_micro_is_refused() -> None:
    with pytest.raises(CalibrationError, match="cheapest threshold's cost per 1k requests \\(10000 micro-USD\\)"):
        cost_threshold([0.2, 0.4], [10, 10], [50, 50], 9_999)
    with pytest.raises(CalibrationError, match=">= 0"):
        cost_threshold([0.2], [1], [2], -1)
    with pytest.raises(CalibrationError, match="one entry per request"):
        cost_threshold([0.2, 0.3], [1], [2], 10)


def test_cost_per_1k_rounds_half_up() -> None:
    assert cost_per_1k(1, 2000) == 1  # 0.5 -> 1
    assert cost_per_1k(1, 3000) == 0


def test_shown_threshold_is_short_unless_that_moves_a_request() -> None:
    scores = [0.9, 0.41, 0.1]
    assert shown_threshold(scores, 0.655) == "0.655"
    assert shown_threshold(scores, 0.0) == "0"
    close = [0.500001, 0.5000005]
    shown = shown_threshold(close, 0.50000075)
    assert sum(s >= float(shown) for s in close) == 1
