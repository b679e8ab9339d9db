"""Routing quality metrics (RouteLLM's cost-quality curve) and their plot.

Routing the top-k of n prompts by score to the flagship (the rest to micro) gives quality
q(k) = (sum(weak) + sum of (strong - weak) over the routed k) / n. With `k/n` the flagship share:
- PGR(k) = (q(k) - q_weak) / (q_strong - q_weak): performance gap recovered (0 all-micro, 1 all-flagship).
- APGR: the mean of PGR over shares 0..1 (trapezoid over k = 0..n). Random routing scores 0.5.
- CPT(x): the smallest flagship share whose PGR reaches x. Random routing: CPT(x) = x.
- Brier and ECE (10 equal-width bins) compare the score, read as P(micro falls short), with the observed
  event rate (a soft target in [0, 1] where several models' outcomes are averaged).
Tied scores are routed in expectation (their gains averaged), so a constant scorer earns exactly random.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from router_models.training.outcomes import Example

__all__ = [
    "RoutingMetrics", "apgr", "brier", "cpt", "ece", "example_curve", "example_metrics", "metrics", "pgr_curve",
    "plot_curves",
]

Floats = npt.NDArray[np.float64]
Values = Sequence[float] | npt.NDArray[np.float64]


def _tie_averaged_gains(scores: Floats, gains: Floats) -> Floats:
    order = np.argsort(-scores, kind="stable")
    s, g = scores[order], gains[order].astype(np.float64)
    out = g.copy()
    start = 0
    for i in range(1, len(s) + 1):
        if i == len(s) or s[i] != s[start]:
            out[start:i] = g[start:i].mean()
            start = i
    return out


def pgr_curve(scores: Values, weak: Values, strong: Values) -> tuple[Floats, Floats]:
    """(shares, pgr) at k = 0..n prompts routed to the flagship, highest scores first.

    PGR is nan everywhere when the flagship is not better overall (no gap to recover).
    """
    sc, w, st = (np.asarray(x, dtype=np.float64) for x in (scores, weak, strong))
    n = len(sc)
    gains = _tie_averaged_gains(sc, st - w)
    cum = np.concatenate([[0.0], np.cumsum(gains)])
    total = float(st.sum() - w.sum())
    shares = np.arange(n + 1, dtype=np.float64) / max(n, 1)
    if n == 0 or total <= 0:
        return shares, np.full(n + 1, np.nan)
    return shares, cum / total


def apgr(shares: Floats, pgr: Floats) -> float:
    """Average PGR over flagship shares in [0, 1] (trapezoid rule)."""
    return float(np.trapezoid(pgr, shares)) if len(shares) > 1 else float("nan")


def cpt(shares: Floats, pgr: Floats, target: float) -> float:
    """Smallest flagship share with PGR >= target (1.0 if never reached, nan if PGR is undefined)."""
    if np.isnan(pgr).all():
        return float("nan")
    hit = np.nonzero(pgr >= target - 1e-12)[0]
    return float(shares[hit[0]]) if len(hit) else 1.0


@dataclass(frozen=True)
class RoutingMetrics:
    """Router quality on one set of prompts; `*_random` are the expected values of random routing."""

    n: int
    positives: int
    auc: float
    apgr: float
    cpt50: float
    cpt80: float
    brier: float = float("nan")
    ece: float = float("nan")
    mean_score: float = float("nan")
    event_rate: float = float("nan")
    apgr_random: float = 0.5
    cpt50_random: float = 0.5
    cpt80_random: float = 0.8

    def as_dict(self) -> dict[str, float | int]:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def _auc(scores: Floats, labels: npt.NDArray[np.int64]) -> float:
    if labels.min(initial=0) == labels.max(initial=0):
        return float("nan")
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(labels, scores))


def brier(scores: Values, event: Values) -> float:
    """Mean squared difference between the predicted probability and the (soft) observed event."""
    sc, ev = np.asarray(scores, dtype=np.float64), np.asarray(event, dtype=np.float64)
    return float(np.mean((sc - ev) ** 2)) if len(sc) else float("nan")


def ece(scores: Values, event: Values, bins: int = 10) -> float:
    """Expected calibration error: sum over equal-width score bins of share x |mean score - mean event|."""
    sc, ev = np.asarray(scores, dtype=np.float64), np.asarray(event, dtype=np.float64)
    if not len(sc):
        return float("nan")
    which = np.minimum((sc * bins).astype(int), bins - 1)
    total = 0.0
    for b in range(bins):
        inside = which == b
        if inside.any():
            total += inside.mean() * abs(sc[inside].mean() - ev[inside].mean())
    return float(total)


def metrics(
    scores: Values, labels: Sequence[int], weak: Values, strong: Values, event: Values | None = None
) -> RoutingMetrics:
    """AUC of score vs label, APGR and CPT(50%)/CPT(80%) of the cost-quality curve; with `event` (the
    observed P(micro falls short) per prompt) also Brier, ECE and the mean score against the event rate."""
    shares, pgr = pgr_curve(scores, weak, strong)
    lab = np.asarray(labels, dtype=np.int64)
    sc = np.asarray(scores, dtype=np.float64)
    calibration = {}
    if event is not None:
        calibration = {"brier": brier(sc, event), "ece": ece(sc, event), "mean_score": float(sc.mean()),
                       "event_rate": float(np.mean(np.asarray(event, dtype=np.float64)))}
    return RoutingMetrics(
        n=len(lab),
        positives=int(lab.sum()),
        auc=_auc(sc, lab),
        apgr=apgr(shares, pgr),
        cpt50=cpt(shares, pgr, 0.5),
        cpt80=cpt(shares, pgr, 0.8),
        **calibration,
    )


def example_curve(scores: Values, examples: Sequence[Example]) -> tuple[Floats, Floats]:
    """`pgr_curve` of scores for examples with real outcomes (their `weak` and `strong`)."""
    return pgr_curve(scores, [e.weak for e in examples], [e.strong for e in examples])


def example_metrics(scores: Values, examples: Sequence[Example]) -> RoutingMetrics:
    """`metrics` of scores for examples with real outcomes, calibration against their event included."""
    return metrics(scores, [e.label for e in examples], [e.weak for e in examples], [e.strong for e in examples],
                   [e.target for e in examples])


def plot_curves(curves: dict[str, tuple[Floats, Floats]], path: Path, title: str) -> Path:
    """Write PGR vs flagship share, one line per named curve plus the random-routing diagonal, as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.5), dpi=110)
    for name, (shares, pgr) in curves.items():
        ax.plot(shares * 100, pgr, label=f"{name} (APGR {apgr(shares, pgr):.3f})")
    ax.plot([0, 100], [0, 1], "k--", linewidth=1, label="random (APGR 0.500)")
    ax.set(xlabel="calls to flagship pool (%)", ylabel="performance gap recovered", title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path
