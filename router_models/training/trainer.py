"""Offline training of the complexity router (`cascade router train`). Never imported by serving code.

Data: real outcomes only (`outcomes.load_outcomes`: seven public sources, six exam-style and one chat, 7B to
frontier models), optionally plus a user's own label rows (`labels.py`: a label file or the gateway's ledger).
Each source gets the same total weight, so the 14,000 MMLU questions do not drown the 1,300 GSM8K ones.

Fit (`fit_router`): the target (`targets.py`) is regressed by ridge on [embedding, structural features];
the ridge strength is chosen by leave-one-source-out inside the training sources (mean APGR of the
out-of-source scores), and those same out-of-source scores fit the Platt calibration, so the final
probabilities are calibrated for traffic of a kind the fit never saw. Deterministic end to end.

Targets are centred within each source (`center_per_source`): the ridge learns what makes a prompt harder
than others of its kind, not which exam a prompt comes from (a cue that says nothing about a kind of traffic
it never saw); the overall level comes back through the calibration. Measured leave-one-source-out, centring
raised the mean APGR from 0.584 to 0.598 (pairwise target) and from 0.574 to 0.598 (irt-fail).

Preference sources (`SourceSpec.kind == "chat"`) teach the ranking but not the calibration: their event is a
win rate among the answers judged for a prompt, not an absolute P(the micro answer falls short), so the Platt
fit gives their rows no weight (`calibration_weights`) and the score keeps the scale of graded outcomes.
"""

from __future__ import annotations

import platform
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from router_models.embedders.disk_cache import embed_cached
from router_models.embedders.protocol import Embedder
from router_models.serving.classifier import LinearRouter, feature_matrix
from router_models.training.evaluate import apgr, example_curve
from router_models.training.fit import fit_platt, group_stats, solve_ridge, union
from router_models.training.outcomes import DEFAULT_ROUTING_DIR, SOURCES, Example, data_hash
from router_models.training.targets import targets

__all__ = [
    "FEATURE_SETS", "Fitted", "TrainConfig", "calibration_weights", "features", "fit_router", "mask_features",
    "source_weights", "training_metadata",
]

Floats = npt.NDArray[np.float64]
FEATURE_SETS = ("embedding+structure", "embedding", "structure")


@dataclass(frozen=True)
class TrainConfig:
    """What the router is fitted on and how. `alphas`: ridge strengths tried (per unit of weight)."""

    routing_dir: Path = DEFAULT_ROUTING_DIR
    target: str = "irt-pairwise"
    feature_set: str = "embedding+structure"
    alphas: tuple[float, ...] = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)
    balance_sources: bool = True
    center_per_source: bool = True


@dataclass(frozen=True)
class Fitted:
    """A fitted, calibrated router and how it was chosen (`inner_apgr`: out-of-source APGR per alpha)."""

    router: LinearRouter
    alpha: float
    platt: tuple[float, float]
    inner_apgr: dict[str, float] = field(default_factory=dict)


def features(embedder: Embedder, examples: Sequence[Example], feature_set: str) -> npt.NDArray[np.float32]:
    """The classifier's input rows for `examples`, with the unused half zeroed for the reduced sets.

    Zeroing (rather than dropping) keeps one artifact layout; a zero column gets a zero weight.
    """
    if feature_set not in FEATURE_SETS:
        raise ValueError(f"unknown feature set {feature_set!r}; choose one of {', '.join(FEATURE_SETS)}")
    texts = [ex.text for ex in examples]
    return mask_features(feature_matrix(embed_cached(embedder, texts), texts), embedder.dim, feature_set)


def mask_features(x: npt.NDArray[np.float32], dim: int, feature_set: str) -> npt.NDArray[np.float32]:
    """A copy of full feature rows (`dim` embedding columns, then structure) reduced to `feature_set`."""
    if feature_set not in FEATURE_SETS:
        raise ValueError(f"unknown feature set {feature_set!r}; choose one of {', '.join(FEATURE_SETS)}")
    out = x.copy()
    if feature_set == "structure":
        out[:, :dim] = 0.0
    elif feature_set == "embedding":
        out[:, dim:] = 0.0
    return out


def source_weights(examples: Sequence[Example], balance: bool = True) -> Floats:
    """Per-example weights, mean 1; with `balance`, every source carries the same total weight."""
    if not balance:
        return np.ones(len(examples))
    sources = [ex.source for ex in examples]
    counts = {s: sources.count(s) for s in set(sources)}
    w = np.asarray([1.0 / counts[s] for s in sources], dtype=np.float64)
    return np.asarray(w * len(w) / w.sum(), dtype=np.float64)


def calibration_weights(examples: Sequence[Example], weights: Floats) -> Floats:
    """`weights` with the rows of preference sources set to 0 (all of them kept when nothing else is left)."""
    chat = {s.name for s in SOURCES if s.kind == "chat"}
    keep = np.asarray([ex.source not in chat for ex in examples])
    return np.asarray(weights * keep, dtype=np.float64) if keep.any() else weights


def _groups(examples: Sequence[Example]) -> list[str]:
    """Fold of each example: its source, or (one source only) one of 5 folds by its prompt key."""
    sources = [ex.source for ex in examples]
    if len(set(sources)) > 1:
        return sources
    return [f"fold{sum(map(ord, ex.key)) % 5}" for ex in examples]


def _centred(y: Floats, sources: Sequence[str]) -> Floats:
    out = y.copy()
    labels = np.asarray(sources)
    for source in set(sources):
        inside = labels == source
        out[inside] -= y[inside].mean()
    return out


def _apgr(scores: Floats, examples: Sequence[Example]) -> float:
    return apgr(*example_curve(scores, examples))


def fit_router(x: npt.NDArray[np.float32], examples: Sequence[Example], cfg: TrainConfig) -> Fitted:
    """Fit, choose alpha by out-of-group APGR, calibrate on the out-of-group scores, and fold it all."""
    y = targets(examples, cfg.target)
    if cfg.center_per_source:
        y = _centred(y, [ex.source for ex in examples])
    event = np.asarray([ex.target for ex in examples], dtype=np.float64)
    w = source_weights(examples, cfg.balance_sources)
    groups = _groups(examples)
    names = sorted(set(groups))
    index = {g: np.asarray([i for i, gi in enumerate(groups) if gi == g]) for g in names}
    stats = {g: group_stats(x[idx], y[idx], w[idx]) for g, idx in index.items()}
    oof: dict[float, Floats] = {}
    inner: dict[str, float] = {}
    for alpha in cfg.alphas:
        raw = np.zeros(len(examples))
        for g in names:
            ridge = solve_ridge(union(stats, [h for h in names if h != g]), alpha)
            raw[index[g]] = ridge.predict(x[index[g]])
        oof[alpha] = raw
        inner[str(alpha)] = float(np.mean([_apgr(raw[index[g]], [examples[i] for i in index[g]]) for g in names]))
    best = max(cfg.alphas, key=lambda a: inner[str(a)])
    a, c = fit_platt(oof[best], event, calibration_weights(examples, w))
    final = solve_ridge(union(stats, names), best)
    return Fitted(router=final.calibrated(a, c), alpha=best, platt=(a, c), inner_apgr=inner)


def training_metadata(cfg: TrainConfig, examples: Sequence[Example], fitted: Fitted) -> dict[str, Any]:
    """The artifact's description of how it was made (the evaluation is added by the caller)."""
    counts: dict[str, int] = {}
    for ex in examples:
        counts[ex.source] = counts.get(ex.source, 0) + 1
    return {
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "data_sha256": data_hash(examples),
        "train_examples": len(examples),
        "sources": counts,
        "target": cfg.target,
        "event": "the micro pool's answer falls short of the flagship's: "
                 "P(micro-class model wrong and frontier-class model right)",
        "feature_set": cfg.feature_set,
        "model": {"type": "ridge on standardised features + Platt calibration",
                  "alpha": fitted.alpha, "platt": list(fitted.platt), "balance_sources": cfg.balance_sources,
                  "center_per_source": cfg.center_per_source,
                  "calibrated_on": "graded outcomes (preference sources rank, they do not calibrate)",
                  "inner_out_of_source_apgr": fitted.inner_apgr},
        "python": platform.python_version(),
    }
