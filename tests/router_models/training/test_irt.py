"""The Rasch fit recovers abilities and difficulties it simulated, ignores missing outcomes, is deterministic."""

from __future__ import annotations

import numpy as np

from router_models.training.irt import fit_rasch


def _simulate(seed: int, items: int = 3000, models: int = 12) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ability = np.linspace(-1.5, 1.5, models)
    difficulty = rng.normal(0.0, 1.0, items)
    p = 1.0 / (1.0 + np.exp(-(ability[None, :] - difficulty[:, None])))
    return (rng.random((items, models)) < p).astype(float), ability, difficulty


def test_recovers_simulated_parameters() -> None:
    y, ability, difficulty = _simulate(0, models=40)
    fit = fit_rasch(y)
    # identified up to a shift; the prior shrinks a little
    assert np.corrcoef(fit.ability, ability)[0, 1] > 0.99
    assert np.corrcoef(fit.difficulty, difficulty)[0, 1] > 0.85
    assert fit.iterations < 200


def test_missing_outcomes_are_left_out() -> None:
    y, ability, _ = _simulate(1)
    holes = y.copy()
    holes[::3, 0] = np.nan
    fit = fit_rasch(holes)
    assert np.all(np.isfinite(fit.ability)) and np.all(np.isfinite(fit.difficulty))
    assert np.corrcoef(fit.ability, ability)[0, 1] > 0.99


def test_items_everyone_or_no_one_solves_stay_finite_and_ordered() -> None:
    y = np.array([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [1.0, 0.0, np.nan]])
    fit = fit_rasch(y)
    assert np.all(np.isfinite(fit.difficulty))
    assert fit.difficulty[0] < fit.difficulty[2] < fit.difficulty[1]


def test_deterministic() -> None:
    y, _, _ = _simulate(2, items=500)
    a, b = fit_rasch(y), fit_rasch(y)
    assert np.array_equal(a.ability, b.ability) and np.array_equal(a.difficulty, b.difficulty)
