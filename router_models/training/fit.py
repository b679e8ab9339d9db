"""The router's fit: weighted ridge regression on standardised features, then Platt calibration, folded
into one `LinearRouter` (score = sigmoid(w . x + b)).

Ridge fits are solved from per-group sufficient statistics (weighted sums of x, x x^T, y, x y), so a fit on
any union of sources is one small linear solve: leave-one-source-out and the regularisation grid cost
milliseconds, and every fit is deterministic (no solver iterations, no random state).

Calibration maps the ridge output r to P(micro falls short) = sigmoid(a r + c), fitted by weighted log-loss
against the soft event target on scores the model made for sources it was not fitted on (out-of-source
predictions), so the probabilities hold on traffic of a kind the router has not seen.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from router_models.serving.classifier import LinearRouter

__all__ = ["GroupStats", "Ridge", "fit_platt", "group_stats", "solve_ridge"]

Floats = npt.NDArray[np.float64]


@dataclass(frozen=True)
class GroupStats:
    """Weighted sufficient statistics of one group of rows: sum w, sum w x, sum w x x^T, sum w y, sum w x y."""

    s0: float
    s1: Floats
    s2: Floats
    t1: float
    t2: Floats

    def __add__(self, other: GroupStats) -> GroupStats:
        return GroupStats(self.s0 + other.s0, self.s1 + other.s1, self.s2 + other.s2, self.t1 + other.t1,
                          self.t2 + other.t2)


def group_stats(x: npt.NDArray[np.floating], y: Floats, w: Floats) -> GroupStats:
    """Sufficient statistics of rows `x` (n, d) with targets `y` and weights `w` (float64 throughout)."""
    xd = np.asarray(x, dtype=np.float64)
    wx = xd * w[:, None]
    return GroupStats(float(w.sum()), wx.sum(axis=0), wx.T @ xd, float(w @ y), wx.T @ y)


@dataclass(frozen=True)
class Ridge:
    """A ridge fit on raw features: r = coef . x + intercept."""

    coef: Floats
    intercept: float

    def predict(self, x: npt.NDArray[np.floating]) -> Floats:
        return np.asarray(np.asarray(x, dtype=np.float64) @ self.coef + self.intercept, dtype=np.float64)

    def calibrated(self, a: float, c: float) -> LinearRouter:
        """The `LinearRouter` computing sigmoid(a * r + c)."""
        return LinearRouter(weights=(a * self.coef).astype(np.float32), bias=float(a * self.intercept + c))


def solve_ridge(stats: GroupStats, alpha: float) -> Ridge:
    """Ridge on standardised features (each column scaled to unit weighted variance) with penalty `alpha`
    per unit of total weight; returns the fit unfolded onto raw features."""
    mean = stats.s1 / stats.s0
    cov = stats.s2 / stats.s0 - np.outer(mean, mean)
    cross = stats.t2 / stats.s0 - mean * (stats.t1 / stats.s0)
    scale = np.sqrt(np.clip(np.diag(cov), 1e-12, None))
    corr = cov / np.outer(scale, scale)
    v = np.linalg.solve(corr + alpha * np.eye(len(mean)), cross / scale)
    coef = v / scale
    return Ridge(coef=coef, intercept=float(stats.t1 / stats.s0 - mean @ coef))


def _log_loss(design: Floats, params: Floats, target: Floats, weights: Floats) -> float:
    logit = design @ params
    return float(np.sum(weights * (np.logaddexp(0.0, logit) - target * logit)))


def fit_platt(raw: Floats, target: Floats, weights: Floats, iterations: int = 50) -> tuple[float, float]:
    """(a, c) minimising the weighted log-loss of sigmoid(a * raw + c) against soft targets in [0, 1]
    (Newton's method on two parameters from a = 1, c = 0, each step halved until the loss does not rise).

    The halving matters where the best slope is near 0 (a ranking that barely carries the event): plain Newton
    steps then oscillate and ran away to a slope of 1e10 on real outcomes, every probability saturated and the
    router a constant. Where the full step lowers the loss (the usual case) the result is plain Newton's.
    Deterministic."""
    z = (raw - raw.mean()) / (raw.std() + 1e-12)
    params = np.zeros(2)
    params[0] = 1.0
    design = np.stack([z, np.ones_like(z)], axis=1)
    loss = _log_loss(design, params, target, weights)
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-np.clip(design @ params, -30, 30)))
        grad = design.T @ (weights * (p - target))
        hess = (design * (weights * p * (1 - p))[:, None]).T @ design + 1e-9 * np.eye(2)
        delta = np.linalg.solve(hess, grad)
        step = 1.0
        while step > 1e-6 and _log_loss(design, params - step * delta, target, weights) > loss:
            step /= 2
        params = params - step * delta
        loss = _log_loss(design, params, target, weights)
        if np.abs(step * delta).max() < 1e-10:
            break
    a = float(params[0] / (raw.std() + 1e-12))
    return a, float(params[1] - a * raw.mean())


def union(stats: Mapping[str, GroupStats], names: Sequence[str]) -> GroupStats:
    """The statistics of the union of the named groups."""
    total = stats[names[0]]
    for name in names[1:]:
        total = total + stats[name]
    return total
