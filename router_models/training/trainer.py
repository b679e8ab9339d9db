"""Offline training of the complexity router (`cascade router train`). Never imported by serving code.

Data: real outcomes only (`outcomes.load_outcomes`: seven public sources, six exam-style and one chat, 7B to
frontier models), optionally plus a user's own label rows (`labels.py`: a label file or the gateway's ledger).
Each public source gets the same total weight, so the 14,000 MMLU questions do not drown the 1,300 GSM8K ones;
own label rows enter as `TrainConfig.own_labels` says (`own_labels.py`): by default as a per-user correction
on top of the public model (penalty 3,000), the best of the modes tried on the learning curve (MODEL_CARD.md).

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
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from router_models.embedders.disk_cache import embed_cached
from router_models.embedders.features import FEATURE_NAMES
from router_models.embedders.protocol import Embedder
from router_models.serving.classifier import LinearRouter, SourceRouters, feature_matrix
from router_models.serving.label_memory import LabelMemory, MemoryParams, MemoryRouter, gap_target
from router_models.training.evaluate import apgr, example_curve
from router_models.training.fit import GroupStats, fit_platt, group_stats, solve_ridge, union
from router_models.training.outcomes import DEFAULT_ROUTING_DIR, SOURCES, Example, data_hash
from router_models.training.own_labels import OWN_LABEL_MODES, fit_correction, is_own, own_share
from router_models.training.targets import targets

__all__ = [
    "FEATURE_SETS", "Fitted", "SourceRows", "TrainConfig", "calibration_weights", "centred", "correct", "features",
    "fit_router", "fit_sources", "mask_features", "own_source_rows", "source_routers", "source_rows", "source_weights",
    "training_metadata",
]

Floats = npt.NDArray[np.float64]
FEATURE_SETS = ("embedding+structure", "embedding", "structure")
SOURCE_ROUTER_ROWS = 200
"""A public source gets a router of its own (`source_routers`) from this many rows up."""


@dataclass(frozen=True)
class TrainConfig:
    """What the router is fitted on and how. `alphas`: ridge strengths tried (per unit of weight); `own_labels`:
    how a user's own label rows enter (`own_labels.OWN_LABEL_MODES`), with `own_k` (share mode),
    `own_penalty` (correction mode) and `memory` (memory mode: how the labels move nearby scores)."""

    routing_dir: Path = DEFAULT_ROUTING_DIR
    target: str = "irt-pairwise"
    feature_set: str = "embedding+structure"
    alphas: tuple[float, ...] = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)
    balance_sources: bool = True
    center_per_source: bool = True
    own_labels: str = "correction"  # chosen on the learning curve (MODEL_CARD.md, "Learning curve")
    own_k: float = 1000.0
    own_penalty: float = 3000.0  # the correction mode's
    memory: MemoryParams = field(default_factory=MemoryParams)  # its defaults: the learning curve's best

    def __post_init__(self) -> None:
        if self.own_labels not in OWN_LABEL_MODES:
            raise ValueError(f"unknown own-label mode {self.own_labels!r}; choose one of {', '.join(OWN_LABEL_MODES)}")


@dataclass(frozen=True)
class Fitted:
    """A fitted, calibrated router and how it was chosen (`inner_apgr`: out-of-source APGR per alpha)."""

    router: LinearRouter
    alpha: float
    platt: tuple[float, float]
    inner_apgr: dict[str, float] = field(default_factory=dict)
    own: dict[str, Any] = field(default_factory=dict)  # how own label rows were used (empty: none were given)
    memory: LabelMemory | None = None  # the own rows as a label memory (memory mode), served beside `router`

    def predictor(self) -> LinearRouter | MemoryRouter:
        """What scores: `router`, with `memory` attached when there is one."""
        return self.router if self.memory is None else MemoryRouter.attach(self.router, self.memory)


def features(embedder: Embedder, examples: Sequence[Example], feature_set: str) -> npt.NDArray[np.float32]:
    """The classifier's input rows for `examples`, with the unused half zeroed for the reduced sets.

    Zeroing (rather than dropping) keeps one artifact layout; a zero column gets a zero weight.
    """
    if feature_set not in FEATURE_SETS:
        raise ValueError(f"unknown feature set {feature_set!r}; choose one of {', '.join(FEATURE_SETS)}")
    texts = [ex.text for ex in examples]
    shapes = [ex.shape for ex in examples]
    return mask_features(feature_matrix(embed_cached(embedder, texts), texts, shapes), embedder.dim, feature_set)


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


def source_weights(examples: Sequence[Example], balance: bool = True, own_k: float | None = None) -> Floats:
    """Per-example weights, mean 1; with `balance`, every public source carries the same total weight.

    Own label rows (`own_labels.is_own`): with `own_k` None, each own source weighs like a public one (the
    `equal` mode); with `own_k`, all own rows together carry the share n_own / (n_own + own_k) of the total
    (the `share` mode), one weight per own row, the public sources the rest.
    """
    if not balance:
        return np.ones(len(examples))
    sources = [ex.source for ex in examples]
    counts = Counter(sources)
    w = np.asarray([1.0 / counts[s] for s in sources], dtype=np.float64)
    own = np.asarray([is_own(s) for s in sources])
    if own_k is not None and own.any() and not own.all():
        share = own_share(int(own.sum()), own_k)
        w[~own] *= (1.0 - share) / w[~own].sum()
        w[own] = share / own.sum()
    return np.asarray(w * len(w) / w.sum(), dtype=np.float64)


def calibration_weights(examples: Sequence[Example], weights: Floats) -> Floats:
    """`weights` with the rows of preference sources set to 0 (all of them kept when nothing else is left)."""
    chat = {s.name for s in SOURCES if s.kind == "chat"}
    keep = np.asarray([ex.source not in chat for ex in examples])
    return np.asarray(weights * keep, dtype=np.float64) if keep.any() else weights


@dataclass(frozen=True)
class SourceRows:
    """The rows of one source (or one fold of a lone source) in a fit: features, examples, the training
    target (centred when configured) and the rows' unweighted sufficient statistics."""

    x: npt.NDArray[np.float32]
    examples: list[Example]
    y: Floats
    stats: GroupStats


def source_rows(x: npt.NDArray[np.float32], examples: Sequence[Example], cfg: TrainConfig) -> dict[str, SourceRows]:
    """`examples` split into the fit's groups (`_groups`), with their targets (centred within each source)."""
    y = targets(examples, cfg.target)
    if cfg.center_per_source:
        y = centred(y, [ex.source for ex in examples])
    groups = _groups(examples)
    out: dict[str, SourceRows] = {}
    for g in sorted(set(groups)):
        idx = np.asarray([i for i, gi in enumerate(groups) if gi == g])
        out[g] = SourceRows(x[idx], [examples[i] for i in idx], y[idx],
                            group_stats(x[idx], y[idx], np.ones(len(idx))))
    return out


def own_source_rows(x: npt.NDArray[np.float32], examples: Sequence[Example], cfg: TrainConfig) -> dict[str, SourceRows]:
    """One own source's rows as `source_rows` gives them beside public sources: 5 folds `<source>#fold<k>`."""
    rows = source_rows(x, examples, cfg)  # a lone source: folds fold0..fold4
    return {f"{examples[0].source}#{g}": r for g, r in rows.items()}


def _fold(ex: Example) -> str:
    return f"fold{sum(map(ord, ex.key)) % 5}"


def _groups(examples: Sequence[Example]) -> list[str]:
    """Fold of each example in the inner cross-validation: a public source is one fold; an own source (a user's
    labels, `own_labels.is_own`) is 5 folds by prompt key, `<source>#fold<k>`, so its out-of-fold scores come
    from a model that saw the rest of the user's labels (the calibration reads them); a lone source: 5 folds."""
    sources = [ex.source for ex in examples]
    if len(set(sources)) == 1:
        return [_fold(ex) for ex in examples]
    return [f"{ex.source}#{_fold(ex)}" if is_own(ex.source) else ex.source for ex in examples]


def centred(y: Floats, sources: Sequence[str]) -> Floats:
    """`y` less its mean within each source (`sources[i]` of `y[i]`)."""
    out = y.copy()
    labels = np.asarray(sources)
    for source in set(sources):
        inside = labels == source
        out[inside] -= y[inside].mean()
    return out


def _apgr(scores: Floats, examples: Sequence[Example]) -> float:
    return apgr(*example_curve(scores, examples))


def fit_router(x: npt.NDArray[np.float32], examples: Sequence[Example], cfg: TrainConfig) -> Fitted:
    """Fit, choose alpha by out-of-group APGR, calibrate on the out-of-group scores, and fold it all.

    Own label rows enter as `cfg.own_labels` says (`own_labels.py`)."""
    own = np.asarray([is_own(ex.source) for ex in examples])
    if cfg.own_labels in ("correction", "memory") and own.any() and not own.all():
        public = np.flatnonzero(~own)
        fitted = fit_sources(source_rows(x[public], [examples[i] for i in public], cfg), cfg)
        return correct(fitted, x[own], [ex for ex, o in zip(examples, own, strict=True) if o], cfg)
    return fit_sources(source_rows(x, examples, cfg), cfg)


def correct(fitted: Fitted, x: npt.NDArray[np.float32], own: Sequence[Example], cfg: TrainConfig) -> Fitted:
    """`fitted` (public sources only) with a per-user correction fitted on own rows `x` (`own_labels`); in the
    memory mode, `fitted`'s router unchanged with the same rows as a `LabelMemory` beside it (what a gateway serves:
    the artifact it has plus the labels' memory; no fit)."""
    if cfg.own_labels == "memory":
        width = x.shape[1] - len(FEATURE_NAMES)  # the embedding's columns (all of a row narrower than the structure)
        memory = LabelMemory(np.asarray(x, np.float32), np.asarray([gap_target(ex.weak, ex.strong) for ex in own]),
                             width if width > 0 else x.shape[1], cfg.memory, tuple(ex.key for ex in own))
        used = {"mode": "memory", "rows": len(own),
                "memory": {**asdict(cfg.memory), "conflicting_prompts": memory.conflicts()}}
        return replace(fitted, own=used, memory=memory)
    fix = fit_correction(fitted.router, x, own, cfg.own_penalty)
    return replace(fitted, router=fix.router, own={"mode": cfg.own_labels, "rows": len(own),
                                                   "penalty": cfg.own_penalty, "target": "event",
                                                   "shift": round(fix.shift, 6)})


def source_routers(x: npt.NDArray[np.float32], examples: Sequence[Example], cfg: TrainConfig) -> SourceRouters | None:
    """One router per public source of `examples` with at least `SOURCE_ROUTER_ROWS` rows, each fitted on that
    source alone as `fit_sources` fits (5 folds choose its ridge); None when no source has that many. A label
    memory combines them to read a user's traffic (`label_memory.fit_combination`); they are served in the
    artifact beside the pooled router."""
    by_source: dict[str, list[int]] = {}
    for i, ex in enumerate(examples):
        if not is_own(ex.source):
            by_source.setdefault(ex.source, []).append(i)
    fits = [(name, fit_sources(source_rows(x[idx], [examples[i] for i in idx], cfg), cfg).router)
            for name, idx in by_source.items() if len(idx) >= SOURCE_ROUTER_ROWS]
    if not fits:
        return None
    return SourceRouters(tuple(name for name, _ in fits), np.stack([r.weights for _, r in fits]).astype(np.float32),
                         np.asarray([r.bias for _, r in fits], np.float64))


def fit_sources(rows: Mapping[str, SourceRows], cfg: TrainConfig) -> Fitted:
    """`fit_router` on rows already split by source (so callers fitting many subsets compute each once)."""
    names = sorted(rows)
    examples = [ex for g in names for ex in rows[g].examples]
    k = cfg.own_k if cfg.own_labels == "share" else None
    w = source_weights(examples, cfg.balance_sources, k)
    starts = np.cumsum([0] + [len(rows[g].examples) for g in names])
    index = {g: np.arange(starts[i], starts[i + 1]) for i, g in enumerate(names)}
    # weights are constant within a source (a lone source's folds: all 1), so its stats scale by one number
    stats = {g: _scaled(rows[g].stats, float(w[index[g][0]])) for g in names}
    oof: dict[float, Floats] = {}
    inner: dict[str, float] = {}
    for alpha in cfg.alphas:
        raw = np.zeros(len(examples))
        for g in names:
            ridge = solve_ridge(union(stats, [h for h in names if h != g]), alpha)
            raw[index[g]] = ridge.predict(rows[g].x)
        oof[alpha] = raw
        inner[str(alpha)] = _inner_apgr({g: _apgr(raw[index[g]], rows[g].examples) for g in names})
    best = max(cfg.alphas, key=lambda a: inner[str(a)])
    event = np.asarray([ex.target for ex in examples], dtype=np.float64)
    a, c = fit_platt(oof[best], event, calibration_weights(examples, w))
    final = solve_ridge(union(stats, names), best)
    own = sum(1 for ex in examples if is_own(ex.source))
    mode = {"mode": cfg.own_labels, "rows": own} if own else {}
    return Fitted(router=final.calibrated(a, c), alpha=best, platt=(a, c), inner_apgr=inner, own=mode)


def _inner_apgr(per_group: Mapping[str, float]) -> float:
    """Mean out-of-group APGR over sources, an own source's folds averaged first (it counts as one source)."""
    per_source: dict[str, list[float]] = {}
    for g, value in per_group.items():
        per_source.setdefault(g.split("#")[0], []).append(value)
    means = [float(np.mean(f)) for v in per_source.values() if len(f := [x for x in v if not np.isnan(x)])]
    return float(np.mean(means)) if means else float("nan")


def _scaled(stats: GroupStats, c: float) -> GroupStats:
    return GroupStats(stats.s0 * c, stats.s1 * c, stats.s2 * c, stats.t1 * c, stats.t2 * c)


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
                  "inner_out_of_source_apgr": fitted.inner_apgr,
                  **({"own_labels": fitted.own} if fitted.own else {})},
        "python": platform.python_version(),
    }
