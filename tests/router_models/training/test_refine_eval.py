"""The two-stage router's leave-one-source-out figure: with no band it is the fast router's curve, with a band
covering every score the refiner's, and the share refined grows with the band (synthetic scores: mechanics only)."""

from __future__ import annotations

import numpy as np
import pytest

from router_models.training.evaluate import apgr, pgr_curve
from router_models.training.refine_eval import refined_apgr


def _data(n: int = 3000) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    hard = rng.random(n)
    weak = (rng.random(n) > hard).astype(float)
    strong = (rng.random(n) > hard / 2).astype(float)
    fast = 0.3 + 0.1 * (hard + rng.normal(0, 0.6, n))  # both know the difficulty; the refiner knows it better
    refiner = 0.3 + 0.1 * (hard + rng.normal(0, 0.2, n))
    return fast, refiner, weak, strong


def test_no_band_is_the_fast_router_and_a_full_band_the_refiner() -> None:
    fast, refiner, weak, strong = _data()
    alone = refined_apgr(fast, refiner, weak, strong, band=0.0)
    assert alone.refined == 0.0
    assert alone.apgr == pytest.approx(apgr(*pgr_curve(fast, weak, strong)), abs=2e-3)  # the grid's error
    everything = refined_apgr(fast, refiner, weak, strong, band=1.0)
    assert everything.refined == 1.0 and everything.refined_at_30 == 1.0
    assert everything.apgr == pytest.approx(apgr(*pgr_curve(refiner, weak, strong)), abs=2e-3)
    assert everything.apgr > alone.apgr + 0.01  # the synthetic refiner is better: the test can tell them apart


def test_a_wider_band_refines_more_and_recovers_more() -> None:
    fast, refiner, weak, strong = _data()
    figures = [refined_apgr(fast, refiner, weak, strong, band) for band in (0.0, 0.01, 0.03, 0.1)]
    shares = [f.refined for f in figures]
    assert shares == sorted(shares) and 0.0 < shares[1] < shares[2] < 1.0
    assert figures[2].apgr > figures[0].apgr
