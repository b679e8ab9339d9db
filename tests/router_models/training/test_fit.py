"""Ridge from sufficient statistics equals a direct fit; Platt recovers a known calibration; folding keeps it."""

from __future__ import annotations

import numpy as np
import pytest

from router_models.training.fit import fit_platt, group_stats, solve_ridge, union


def _data(seed: int, n: int = 400, d: int = 6) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)) * np.arange(1, d + 1)
    y = x @ rng.normal(size=d) + rng.normal(scale=0.1, size=n)
    return x, y, rng.uniform(0.5, 2.0, n)


def test_ridge_matches_a_direct_weighted_fit_on_standardised_features() -> None:
    x, y, w = _data(0)
    alpha = 0.3
    fit = solve_ridge(group_stats(x, y, w), alpha)
    mean = np.average(x, axis=0, weights=w)
    scale = np.sqrt(np.average((x - mean) ** 2, axis=0, weights=w))
    z = (x - mean) / scale
    yc = y - np.average(y, weights=w)
    v = np.linalg.solve(z.T @ (z * w[:, None]) / w.sum() + alpha * np.eye(x.shape[1]), z.T @ (w * yc) / w.sum())
    direct = z @ v + np.average(y, weights=w)
    assert fit.predict(x) == pytest.approx(direct, abs=1e-8)


def test_union_of_groups_equals_stats_of_all_rows() -> None:
    x, y, w = _data(1)
    parts = {"a": group_stats(x[:150], y[:150], w[:150]), "b": group_stats(x[150:], y[150:], w[150:])}
    whole = solve_ridge(group_stats(x, y, w), 0.1)
    joined = solve_ridge(union(parts, ["a", "b"]), 0.1)
    assert joined.predict(x) == pytest.approx(whole.predict(x), abs=1e-9)


def test_platt_recovers_a_known_calibration_and_folds_into_the_router() -> None:
    rng = np.random.default_rng(2)
    raw = rng.normal(size=5000)
    prob = 1.0 / (1.0 + np.exp(-(1.7 * raw - 0.8)))
    a, c = fit_platt(raw, prob, np.ones_like(raw))
    assert (a, c) == pytest.approx((1.7, -0.8), abs=1e-3)
    x, y, w = _data(3, d=4)
    ridge = solve_ridge(group_stats(x, y, w), 0.1)
    router = ridge.calibrated(a, c)
    expected = 1.0 / (1.0 + np.exp(-(a * ridge.predict(x) + c)))
    assert router.predict_proba(x.astype(np.float32)) == pytest.approx(expected, abs=1e-4)


def test_platt_on_soft_targets_matches_the_mean() -> None:
    raw = np.zeros(100)
    _, c = fit_platt(raw + np.linspace(-1e-9, 1e-9, 100), np.full(100, 0.25), np.ones(100))
    assert 1.0 / (1.0 + np.exp(-c)) == pytest.approx(0.25, abs=1e-3)


def test_platt_does_not_run_away_where_the_best_slope_is_near_zero() -> None:
    """Plain Newton from slope 1 oscillates and diverges here (slope ~4e6, every probability saturated: a
    constant router); the halved steps find the flat optimum: slope 0, intercept logit(0.5) = 0."""
    rng = np.random.default_rng(0)
    raw = rng.normal(size=2000)
    z = (raw - raw.mean()) / raw.std()
    weights = (np.abs(z) > 2.5).astype(np.float64)  # only the tails weigh: a full Newton step overshoots
    a, c = fit_platt(raw, np.full(2000, 0.5), weights)
    assert abs(a) < 1e-6 and abs(c) < 1e-6
