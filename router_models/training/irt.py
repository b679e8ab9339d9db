"""Item response theory over an outcome matrix: one difficulty per prompt, one ability per model.

The one-parameter (Rasch) model: P(model m answers item i correctly) = sigmoid(ability_m - difficulty_i).
Fitted by maximum a-posteriori with a standard-normal prior on both (which also keeps items every model
answered, or none did, finite), by full-batch Newton steps on the diagonal of the Hessian: the matrix has
tens of thousands of items and at most a few dozen models, so each step is two matrix products. Missing
outcomes (nan) are left out of the likelihood.

Difficulties are comparable across sources once measured against the source's own micro-class ability:
`sigmoid(difficulty - ability_micro)` is P(a micro-class model fails), whatever other models the source has.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["RaschFit", "fit_rasch", "sigmoid"]

Floats = npt.NDArray[np.float64]


@dataclass(frozen=True)
class RaschFit:
    """Fitted abilities (one per model column) and difficulties (one per item row), in logits."""

    ability: Floats
    difficulty: Floats
    iterations: int


def sigmoid(z: Floats) -> Floats:
    """The logistic function, clipped so large logits never overflow."""
    return np.asarray(1.0 / (1.0 + np.exp(-np.clip(z, -30.0, 30.0))), dtype=np.float64)


def fit_rasch(outcomes: Floats, prior: float = 1.0, max_iter: int = 200, tol: float = 1e-6) -> RaschFit:
    """MAP fit of the Rasch model to `outcomes` (items x models; 1, 0 or nan). Deterministic.

    `prior` is the variance of the normal prior on abilities and difficulties. Stops when no parameter moves
    more than `tol` in a step.
    """
    y = np.asarray(outcomes, dtype=np.float64)
    seen = ~np.isnan(y)
    y = np.where(seen, y, 0.0)
    mask = seen.astype(np.float64)
    ability = np.zeros(y.shape[1])
    difficulty = np.zeros(y.shape[0])
    iterations = 0
    while iterations < max_iter:
        iterations += 1
        p = sigmoid(ability[None, :] - difficulty[:, None])
        resid, curv = (y - p) * mask, p * (1.0 - p) * mask
        d_ability = (resid.sum(axis=0) - ability / prior) / (curv.sum(axis=0) + 1.0 / prior)
        ability = ability + d_ability
        p = sigmoid(ability[None, :] - difficulty[:, None])
        resid, curv = (y - p) * mask, p * (1.0 - p) * mask
        d_difficulty = (-resid.sum(axis=1) - difficulty / prior) / (curv.sum(axis=1) + 1.0 / prior)
        difficulty = difficulty + d_difficulty
        if max(np.abs(d_ability).max(initial=0.0), np.abs(d_difficulty).max(initial=0.0)) < tol:
            break
    return RaschFit(ability=ability, difficulty=difficulty, iterations=iterations)
