"""Penalised logistic regression with an offset, by Newton's method: the one fit behind a user's correction
(`training.own_labels.fit_correction`) and a label memory's combination (`label_memory.fit_combination`).

Minimises sum log(1 + e^l) - y l + 1/2 sum ridge theta^2, with l = offset + z theta and soft targets y in [0, 1]; a
fit pulled towards a prior other than 0 passes the prior's logit as the offset. Deterministic: Newton steps from 0,
each halved until the objective does not rise.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["penalised_logistic"]

Floats = npt.NDArray[np.float64]


def _sigmoid(z: Floats) -> Floats:
    return np.asarray(1.0 / (1.0 + np.exp(-np.clip(z, -30.0, 30.0))), dtype=np.float64)


def _objective(z: Floats, offset: Floats, y: Floats, ridge: Floats, theta: Floats) -> float:
    logit = offset + z @ theta
    return float(np.sum(np.logaddexp(0.0, logit) - y * logit) + 0.5 * ridge @ theta**2)


def penalised_logistic(z: Floats, offset: Floats, y: Floats, ridge: Floats, iterations: int) -> tuple[Floats, int]:
    """theta (one per column of `z`) and the Newton steps taken (at most `iterations`; fewer once a step is below
    1e-8, or when 30 halvings do not lower the objective)."""
    theta = np.zeros(z.shape[1])
    current = _objective(z, offset, y, ridge, theta)
    done = 0
    while done < iterations:
        done += 1
        p = _sigmoid(offset + z @ theta)
        grad = z.T @ (p - y) + ridge * theta
        hess = (z * (p * (1.0 - p))[:, None]).T @ z + np.diag(ridge)
        step = np.linalg.solve(hess, grad)
        for _ in range(30):
            trial = _objective(z, offset, y, ridge, theta - step)
            if trial <= current:
                break
            step = step / 2.0
        else:
            break
        theta, current = theta - step, trial
        if np.abs(step).max() < 1e-8:
            break
    return theta, done
