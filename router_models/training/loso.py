"""Leave-one-source-out evaluation of the router (`cascade router eval`, and the figures stored at train time).

For each source S: fit on every other source, with every copy of S's prompts (same `prompt_key`) removed
from training, and score S. That is how production meets the router: a user's traffic is a kind it never
saw. Per held-out source: APGR, CPT(50%), CPT(80%), AUC, Brier, ECE (`evaluate.metrics`); the headline
is their mean over sources. The pooled quality curve (mean PGR over held-out sources at 21 flagship shares)
is what the gateway's cost report and `cascade router calibrate` read as "quality kept at this share".
`by_kind` gives the mean APGR over the exam-style sources and over the chat sources apart
(`SourceSpec.kind`; a user's own labels count as chat), since a mean over six exams hides how chat fares.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from router_models.training.evaluate import RoutingMetrics, example_curve, example_metrics, plot_curves
from router_models.training.outcomes import SOURCES, Example
from router_models.training.trainer import TrainConfig, fit_router

__all__ = ["CURVE_SHARES", "LosoResult", "leave_one_source_out", "print_table", "quality_curve"]

Floats = npt.NDArray[np.float64]
CURVE_SHARES = np.linspace(0.0, 1.0, 21)
_COLUMNS = ("n", "apgr", "cpt50", "cpt80", "auc", "brier", "ece", "mean_score", "event_rate")


@dataclass(frozen=True)
class LosoResult:
    """Held-out scores and metrics per source, in the order the sources were given."""

    scores: dict[str, Floats]
    examples: dict[str, list[Example]]
    metrics: dict[str, RoutingMetrics]
    alphas: dict[str, float]

    def mean(self) -> dict[str, float]:
        """Unweighted mean over held-out sources of each metric (each source counts once)."""
        rows = [m.as_dict() for m in self.metrics.values()]
        return {k: round(float(np.nanmean([float(r[k]) for r in rows])), 4) for k in _COLUMNS if k != "n"}

    def as_dict(self) -> dict[str, Any]:
        return {"per_source": {s: {**m.as_dict(), "alpha": self.alphas[s]} for s, m in self.metrics.items()},
                "mean": self.mean(), "by_kind": self.by_kind(), "quality_curve": quality_curve(self)}

    def by_kind(self) -> dict[str, dict[str, float]]:
        """Mean APGR and AUC over the held-out sources of each kind ("exam", "chat") that has any."""
        out: dict[str, dict[str, float]] = {}
        for kind in ("exam", "chat"):
            rows = [m for s, m in self.metrics.items() if _kind(s) == kind]
            if rows:
                out[kind] = {"sources": len(rows), "apgr": round(float(np.nanmean([m.apgr for m in rows])), 4),
                             "auc": round(float(np.nanmean([m.auc for m in rows])), 4)}
        return out


def leave_one_source_out(x: npt.NDArray[np.float32], examples: Sequence[Example], cfg: TrainConfig,
                         sources: Sequence[str] | None = None) -> LosoResult:
    """Fit without each source (and without its prompts' copies elsewhere), score it, measure it."""
    held = list(sources) if sources is not None else list(dict.fromkeys(ex.source for ex in examples))
    scores: dict[str, Floats] = {}
    kept: dict[str, list[Example]] = {}
    result: dict[str, RoutingMetrics] = {}
    alphas: dict[str, float] = {}
    for source in held:
        test = [i for i, ex in enumerate(examples) if ex.source == source]
        keys = {examples[i].key for i in test}
        train = [i for i, ex in enumerate(examples) if ex.source != source and ex.key not in keys]
        fitted = fit_router(x[train], [examples[i] for i in train], cfg)
        scores[source] = fitted.router.predict_proba(x[test])
        kept[source] = [examples[i] for i in test]
        result[source] = example_metrics(scores[source], kept[source])
        alphas[source] = fitted.alpha
    return LosoResult(scores, kept, result, alphas)


def _kind(source: str) -> str:
    return next((s.kind for s in SOURCES if s.name == source), "chat")


def quality_curve(result: LosoResult) -> dict[str, Any]:
    """Mean PGR over held-out sources at `CURVE_SHARES` flagship shares (the router's cost-quality curve)."""
    curves, kinds = [], []
    for source, scores in result.scores.items():
        shares, pgr = example_curve(scores, result.examples[source])
        if not np.isnan(pgr).all():
            curves.append(np.interp(CURVE_SHARES, shares, pgr))
            kinds.append(_kind(source))
    pgr_mean = np.mean(curves, axis=0) if curves else np.full(len(CURVE_SHARES), np.nan)
    return {"flagship_share": [round(float(s), 4) for s in CURVE_SHARES],
            "pgr": [round(float(p), 4) for p in pgr_mean],
            "basis": f"leave-one-source-out, mean over {len(curves)} held-out sources of real model outcomes "
                     f"({kinds.count('exam')} exam-style, {kinds.count('chat')} chat)"}


def plot_loso(result: LosoResult, path: Path) -> Path:
    """The cost-quality curve of every held-out source, plus their mean, as a PNG."""
    curves: dict[str, tuple[Floats, Floats]] = {}
    for source, scores in result.scores.items():
        curves[f"{source} held out"] = example_curve(scores, result.examples[source])
    mean = quality_curve(result)
    curves["mean over sources"] = (np.asarray(mean["flagship_share"]), np.asarray(mean["pgr"]))
    return plot_curves(curves, path, "router on sources it never saw (leave one source out)")


def print_table(result: LosoResult, title: str) -> None:
    """The per-source table and the mean row, on stdout."""
    print(title)
    print(f"{'held-out source':<20}" + "".join(f"{c:>11}" for c in _COLUMNS))
    for source, m in result.metrics.items():
        row = m.as_dict()
        print(f"{source:<20}" + "".join(f"{row[c]:>11}" if c == "n" else f"{float(row[c]):>11.3f}"
                                        for c in _COLUMNS))
    mean = result.mean()
    print(f"{'mean':<20}{'':>11}" + "".join(f"{mean[c]:>11.3f}" for c in _COLUMNS if c != "n"))
    for kind, figures in result.by_kind().items():
        print(f"{'mean, ' + kind:<20}{figures['sources']:>11}{figures['apgr']:>11.3f}")
    print(f"{'random routing':<20}{'':>11}{0.5:>11.3f}{0.5:>11.3f}{0.8:>11.3f}{0.5:>11.3f}")
