"""How a user's own label rows enter the router's fit, beside the public outcomes.

Own rows are those whose source is not a public source (`outcomes.SOURCES`): a label file's
`labels:<name>` rows and the gateway ledger's `labels:ledger` rows. Their target is the observed event
(`Example.target`, no outcome matrix to fit). Three ways to use them (`OWN_LABEL_MODES`), compared on the
learning curve (`loadtest/studies/learning_curve_fits.py`, MODEL_CARD.md "Learning curve"):

- `equal`: the own rows are one more source, with the same total weight as each public source (so 400 own
  labels weigh like 14,000 MMLU rows: one source of eight).
- `share`: the own rows together carry the share `n / (n + k)` of the total weight (`k` = `own_k`), the
  public sources the rest, equally; the more own labels, the more they count.
- `correction`: the public model is fitted without them, then a per-user correction is fitted on them alone:
  a logistic regression on the own rows' event with the public model's logit as an offset, its weights
  (on standardised features) pulled towards 0 by a ridge penalty `own_penalty` per column. With few labels it
  stays the public model; with many, the labels move it as far as they agree. Logit and correction are both
  linear in the features, so the result is again one `LinearRouter`, calibrated on the own rows' event.
- `memory`: the public model unchanged, and the own rows kept beside it as a label memory on the router's
  feature rows (`router_models.serving.label_memory`): the router's slope and level read on the labels, then a
  request's score moves by the residuals of its nearest labelled prompts, weighted by how close they are and
  shrunk by how few. No model is refitted: served beside the artifact, it grows one label at a time. (A correction
  under it, `fit_correction(target="gap")`, did worse with the fitted slope on the learning curve: MODEL_CARD.md.)

Everything here is deterministic (closed-form weights, Newton's method from a fixed start).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from router_models.serving.classifier import LinearRouter
from router_models.serving.label_memory import gap_target, level_shift
from router_models.serving.logistic import penalised_logistic
from router_models.training.outcomes import SOURCES, Example

__all__ = ["OWN_LABEL_MODES", "Correction", "fit_correction", "is_own", "own_share", "public_names"]

Floats = npt.NDArray[np.float64]
OWN_LABEL_MODES = ("equal", "share", "correction", "memory")


def public_names() -> frozenset[str]:
    """The public sources' names (`outcomes.SOURCES`)."""
    return frozenset(s.name for s in SOURCES)


def is_own(source: str) -> bool:
    """True for a user's own label rows (any source that is not a public one)."""
    return source not in public_names()


def own_share(n_own: int, k: float) -> float:
    """The share of the total training weight that `n_own` own label rows carry under the `share` mode."""
    return n_own / (n_own + k) if n_own > 0 else 0.0


@dataclass(frozen=True)
class Correction:
    """A per-user correction on top of a public `LinearRouter`: `router` is the corrected one; `shift` is the
    norm of the weight change on standardised features (0: the public ranking kept)."""

    router: LinearRouter
    shift: float
    iterations: int


def fit_correction(public: LinearRouter, x: npt.NDArray[np.floating], examples: Sequence[Example],
                   penalty: float, iterations: int = 25, target: str = "event") -> Correction:
    """The public router corrected on own rows `x` (n, d) with outcomes `examples`.

    Minimises the log-loss of sigmoid(public logit + c + u . z) against the soft `target` of each row, plus
    `penalty / 2 * |u|^2`, where z is x standardised by the own rows (columns constant on them are left out).
    The penalty does not grow with n, so more labels move the model further. Newton's method from u = 0, c = 0.
    `target`: "event" (`Example.target`, P(micro wrong and flagship right)) or "gap" (`label_memory.gap_target`,
    the quality gap the flagship recovers mapped to [0, 1], what APGR counts); after a gap fit the bias is shifted
    so that the mean score on the own rows is their mean event again (the ranking is the gap fit's, the scale
    the event's, as thresholds and the cost report read it).
    """
    if target not in ("event", "gap"):
        raise ValueError(f"unknown correction target {target!r}; choose event or gap")
    xd = np.asarray(x, dtype=np.float64)
    events = np.asarray([ex.target for ex in examples], dtype=np.float64)
    y = events if target == "event" else np.asarray([gap_target(ex.weak, ex.strong) for ex in examples])
    offset = xd @ np.asarray(public.weights, dtype=np.float64) + public.bias
    mean, scale = xd.mean(axis=0), xd.std(axis=0)
    used = scale > 1e-6
    z = np.hstack([np.ones((len(y), 1)), (xd[:, used] - mean[used]) / scale[used]])
    ridge = np.full(z.shape[1], float(penalty))
    ridge[0] = 1e-6  # the intercept is (almost) free: the own rows set the level
    theta, done = penalised_logistic(z, offset, y, ridge, iterations)
    coef = np.zeros(xd.shape[1])
    coef[used] = theta[1:] / scale[used]
    weights = np.asarray(public.weights, dtype=np.float64) + coef
    bias = public.bias + theta[0] - float(mean @ coef)
    if target == "gap":
        bias += level_shift(xd @ weights + bias, float(events.mean()))
    router = LinearRouter(weights=weights.astype(np.float32), bias=float(bias))
    return Correction(router=router, shift=float(np.linalg.norm(theta[1:])), iterations=done)
