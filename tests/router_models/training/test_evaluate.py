"""PGR / APGR / CPT on tiny cases computed by hand."""

from __future__ import annotations

import math

import pytest

from router_models.training.evaluate import apgr, cpt, metrics, pgr_curve

WEAK = [1.0, 0.0, 1.0, 0.0]
STRONG = [1.0, 1.0, 1.0, 1.0]  # gains 0, 1, 0, 1: the gap is 2 prompts


def test_perfect_router() -> None:
    shares, pgr = pgr_curve([0.1, 0.9, 0.2, 0.8], WEAK, STRONG)
    assert shares.tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert pgr.tolist() == [0.0, 0.5, 1.0, 1.0, 1.0]
    # trapezoid: 0.25 * (0.25 + 0.75 + 1 + 1)
    assert apgr(shares, pgr) == pytest.approx(0.75)
    assert cpt(shares, pgr, 0.5) == 0.25
    assert cpt(shares, pgr, 0.8) == 0.5


def test_worst_router() -> None:
    shares, pgr = pgr_curve([0.9, 0.1, 0.8, 0.2], WEAK, STRONG)
    assert pgr.tolist() == [0.0, 0.0, 0.0, 0.5, 1.0]
    assert apgr(shares, pgr) == pytest.approx(0.25 * (0.25 + 0.75))
    assert cpt(shares, pgr, 0.8) == 1.0


def test_tied_scores_route_in_expectation_like_random() -> None:
    weak = [1.0, 0.0] * 5
    strong = [1.0] * 10
    shares, pgr = pgr_curve([0.5] * 10, weak, strong)
    assert pgr == pytest.approx(shares)
    assert apgr(shares, pgr) == pytest.approx(0.5)
    assert cpt(shares, pgr, 0.5) == pytest.approx(0.5)
    assert cpt(shares, pgr, 0.8) == pytest.approx(0.8)


def test_negative_gains_count() -> None:
    # prompt 0: only weak right (gain -1); prompts 1, 2: only strong right (+1 each); gap = 1
    _shares, pgr = pgr_curve([0.9, 0.5, 0.1], [1.0, 0.0, 0.0], [0.0, 1.0, 1.0])
    assert pgr.tolist() == [0.0, -1.0, 0.0, 1.0]


def test_no_gap_is_nan() -> None:
    shares, pgr = pgr_curve([0.2, 0.7], [1.0, 1.0], [1.0, 1.0])
    assert all(math.isnan(v) for v in pgr)
    assert math.isnan(cpt(shares, pgr, 0.5))


def test_metrics_bundle() -> None:
    m = metrics([0.1, 0.9, 0.2, 0.8], [0, 1, 0, 1], WEAK, STRONG)
    assert (m.n, m.positives, m.auc, m.apgr, m.cpt50, m.cpt80) == (4, 2, 1.0, 0.75, 0.25, 0.5)
    assert m.as_dict()["apgr_random"] == 0.5
