"""A user's labelled prompts, kept on the router's own embedding, moving its score on nearby traffic.

A `LabelMemory` holds one row per label: the feature row the scorer computes for the prompt (`feature_matrix`:
the L2-normalised embedding, then the structural columns) and the label's target in [0, 1], the quality gap it
recorded mapped to [0, 1]: (flagship quality - micro quality + 1) / 2 (`gap_target`; a `needs_flagship = p` label
is micro 1 - p against flagship 1, so (p + 1) / 2). The gap is what routing a prompt to the flagship gains, and
what APGR counts; on the learning curve it taught the labels more than the event did (MODEL_CARD.md).

Attached to a router (`MemoryRouter`) whose artifact carries its per-source routers (`classifier.SourceRouters`: one
router per public source, fitted on that source alone) and with `MemoryParams.sources` > 0, the router is first read
together with them on the labels (`fit_combination`: a logistic regression of the targets on the router's logit and
the per-source logits, the router's coefficient pulled towards 1 and each source's towards 0 by `sources`, a ridge):
a user whose gaps one source's router ranks better than the pooled router leans towards it, with a handful of
labels hardly at all. That combination's logit stands for "the router's logit" below, and a moved score returns to
the router's scale by the slope and level read on the router's logit alone (the score the router alone would need
for that probability; without the combination the same step as below). Then its score p is
read on the targets' scale by a slope `a` and a level `c` fitted on the labels (`fit_scale`: a logistic regression
of the targets on the router's logit, two numbers; with `MemoryParams.slope` off, a = 1 and c alone makes the mean
of sigmoid(logit p + c) the mean target).
a > 0, so the router's ranking is untouched; a small a says the router ranks this traffic poorly and leaves the
labels more of the say. With the slope fitted, a is then scaled by `slope_scale` (0.5 by default) and c refitted
(`reading_scale`): among labelled neighbours the router's own differences count for less than a fit of the router
alone gives them, and the neighbours' labels for more (on the learning curve that ranked a user's traffic better
at every N; MODEL_CARD.md). Each label gets a residual r_j = t_j - sigmoid(a logit p(x_j) + c), and a request with
feature row x (embedding e, structural columns f) and router score p moves by its neighbours':

    u(x) = [e, structure * (f - m) / (sd sqrt(len f))] / |...|   (m, sd: the structural columns' mean and spread
                                                                 over the labels; structure 0: e alone)
    s_j = u(x) . u(x_j) (cosine similarity), over the `neighbours` labels most similar to x
    w_j = exp((s_j - 1) / bandwidth)                            (a label identical to x weighs 1)
    m = sum_j w_j r_j / (W + prior)                             (the move; W = sum_j w_j)
    se2 = [sum_j w_j (r_j - rbar)^2 / W] * sum_j w_j^2 / W^2    (rbar = sum_j w_j r_j / W: the squared standard
                                                                 error of the neighbours' mean residual)
    q = clip(sigmoid(a logit p + c) + m * m^2 / (m^2 + shrink * se2), eps, 1 - eps)
    score = sigmoid((logit q - c) / a)                          (back on the router's scale)

Below `early_labels` labels the move uses `early_bandwidth` and `early_shrink` (wider and more shrunk: fewer labels
are trusted less; on the learning curve that kept every source at or above its no-label figure at 100 labels).

So it blends the router with the labels by how many and how close they are: a request with no close label keeps
the router's score (the weights vanish against the pseudo-count `prior`); many close labels that agree move it by
their mean residual, and a move its neighbours disagree about (a standard error large against the move) shrinks.
No model is refitted: a label counts the moment it is added (`MemoryRouter.with_labels` scores only the new rows
with the router; the slope, level and residuals are a two-number fit and vector arithmetic over the labels).
Residuals are taken against the router the memory is attached to, so the same labels serve a retrained artifact
without relabelling. Attach it to a router fitted without these labels: against one fitted on them, the labels'
residuals are too small and the fitted slope too steep (on the learning curve that lost to the plain memory).
Conflicting labels of one prompt are all kept (their residuals average in the neighbourhood);
`LabelMemory.conflicts` counts them.

Cost per request: one (n_labels x dim) float32 matrix-vector product and a partition of its values
(`neighbours.nearest`), plus one dot product for the per-source routers (folded into the combination once per
memory); the rest is on the k neighbours, or on Python floats for a lone request. With `structure` > 0 or the
per-source routers it reads the request's whole feature row, which the gateway's scorer keeps beside the embedding
from the worker thread that scored it (`classifier_scorer.ClassifierScorer.features`; computing them again would
cost ~6 ms on the event loop).
Everything is numpy and deterministic; objects are immutable, so a holder swaps them atomically.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from router_models.serving.classifier import LinearRouter
from router_models.serving.logistic import penalised_logistic
from router_models.serving.neighbours import nearest, neighbour_move, neighbour_move_one, similarity_rows

__all__ = ["Combination", "LabelMemory", "MemoryParams", "MemoryRouter", "fit_combination", "fit_scale",
           "gap_target", "level_shift", "neighbour_move", "reading_scale", "similarity_rows"]

Floats = npt.NDArray[np.float64]
FloatArray = npt.NDArray[np.float32]


_EPS = 1e-6
_SLOPES = (0.05, 20.0)  # the router's ranking is kept: a > 0, and a bounded fit
_SLOPE_RIDGE = 1.0


def gap_target(weak: float, strong: float) -> float:
    """A label's memory target: (strong - weak + 1) / 2, the quality gap micro -> flagship mapped to [0, 1]."""
    return (float(strong) - float(weak) + 1.0) / 2.0


def level_shift(logits: Floats, mean_target: float) -> float:
    """c with mean(sigmoid(logits + c)) = `mean_target` (bisection; 0 for no rows). Monotone in c, so exact to
    ~1e-9 after 60 halvings of [-40, 40]."""
    if not len(logits):
        return 0.0
    lo, hi = -40.0, 40.0
    target = min(max(mean_target, _EPS), 1.0 - _EPS)
    for _ in range(60):
        mid = (lo + hi) / 2.0
        if float(np.mean(_sigmoid(logits + mid))) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


def fit_scale(logits: Floats, targets: Floats, slope: bool = True, iterations: int = 50) -> tuple[float, float]:
    """(a, c) minimising the log-loss of sigmoid(a logits + c) against soft `targets` in [0, 1], plus
    `_SLOPE_RIDGE / 2 * (a - 1)^2` (so a handful of labels cannot fling the slope; a hundred outweigh it), by
    Newton's method from a = 1 and the level shift, a kept in `_SLOPES`. With `slope` False, (1, `level_shift`);
    (1, 0) for no rows; the level alone when the logits are all equal (no slope to fit)."""
    if not len(logits):
        return 1.0, 0.0
    level = level_shift(logits, float(np.mean(targets)))
    if not slope or float(np.ptp(logits)) < 1e-9:
        return 1.0, level
    z, t = np.asarray(logits, np.float64), np.asarray(targets, np.float64)
    theta = np.asarray([1.0, level])
    for _ in range(iterations):
        p = _sigmoid(theta[0] * z + theta[1])
        h = p * (1.0 - p) + 1e-12
        grad = np.asarray([(p - t) @ z + _SLOPE_RIDGE * (theta[0] - 1.0), float(np.sum(p - t))])
        hess = np.asarray([[h @ (z * z) + _SLOPE_RIDGE, h @ z], [h @ z, float(h.sum())]])
        step = np.linalg.solve(hess + 1e-9 * np.eye(2), grad)
        theta = theta - step
        if not np.all(np.isfinite(theta)):
            return 1.0, level
        if float(np.abs(step).max()) < 1e-10:
            break
    a = float(np.clip(theta[0], *_SLOPES))
    return a, level_shift(a * z, float(t.mean())) if a != theta[0] else float(theta[1])


def reading_scale(logits: Floats, targets: Floats, params: MemoryParams) -> tuple[float, float]:
    """(a, c) the memory reads the router's logits with: `fit_scale`'s, then (with `params.slope`) a scaled by
    `params.slope_scale` and c refitted so that the mean of sigmoid(a logits + c) is still the mean target."""
    a, c = fit_scale(logits, targets, params.slope)
    if not params.slope or params.slope_scale == 1.0 or not len(logits):
        return a, c
    a *= params.slope_scale
    return a, level_shift(a * np.asarray(logits, np.float64), float(np.mean(targets)))


@dataclass(frozen=True)
class Combination:
    """The router read together with its artifact's per-source routers on a user's labels: logit
    `slope * router logit + source_logits . weights + level` (`fit_combination`). `weights` empty: the router alone."""

    slope: float = 1.0
    weights: Floats = field(default_factory=lambda: np.zeros(0))
    level: float = 0.0

    @property
    def used(self) -> bool:
        return len(self.weights) > 0

    def logits(self, router_logits: Floats, source_logits: Floats) -> Floats:
        out = self.slope * np.asarray(router_logits, np.float64) + self.level
        return out + source_logits @ self.weights if self.used else out


def fit_combination(router_logits: Floats, source_logits: Floats, targets: Floats, ridge: float,
                    iterations: int = 50) -> Combination:
    """A logistic regression of the labels' soft `targets` on the router's logit and the per-source routers'
    logits (each standardised over the labels), by Newton's method: the router's coefficient pulled towards 1
    (`_SLOPE_RIDGE`), each source's towards 0 by `ridge`, the level free. So few labels leave the router as it is,
    and labels whose gaps one source's router ranks better than the pooled one lean towards it. The slope is kept at
    0 at the least (the router's ranking is not turned round; near 0 where the labels say it ranks their traffic
    poorly); a source constant over the labels gets 0."""
    n, k = source_logits.shape
    if n == 0 or k == 0:
        return Combination()
    mean, spread = source_logits.mean(axis=0), source_logits.std(axis=0)
    used = spread > 1e-9
    z = np.hstack([np.asarray(router_logits, np.float64)[:, None],
                   (source_logits[:, used] - mean[used]) / spread[used], np.ones((n, 1))])
    penalty = np.full(z.shape[1], float(ridge))
    penalty[0], penalty[-1] = _SLOPE_RIDGE, 1e-6
    # pulled towards the router as it is (coefficient 1): its logit is the offset, the fit the change from it
    change, _ = penalised_logistic(z, z[:, 0], np.asarray(targets, np.float64), penalty, iterations)
    theta = change + np.eye(z.shape[1])[0]
    if not np.all(np.isfinite(theta)):
        return Combination()
    weights = np.zeros(k)
    weights[used] = theta[1:-1] / spread[used]
    return Combination(max(float(theta[0]), 0.0), weights, float(theta[-1] - weights[used] @ mean[used]))


def _clip(x: Floats, low: float, high: float) -> Floats:
    """`np.clip(x, low, high)`, the same values, without its dispatch: 1-2 us against 5-6 us on the one-row arrays
    `adjust` moves per request, where it runs four times."""
    return np.asarray(np.minimum(np.maximum(x, low), high), np.float64)


def _sigmoid(z: Floats) -> Floats:
    return np.asarray(1.0 / (1.0 + np.exp(-_clip(z, -40.0, 40.0))), np.float64)


def _logit(p: Floats) -> Floats:
    q = _clip(p, _EPS, 1.0 - _EPS)
    return np.asarray(np.log(q) - np.log1p(-q), np.float64)


def _sigmoid_of(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-min(max(z, -40.0), 40.0)))


def _logit_of(p: float) -> float:
    q = min(max(p, _EPS), 1.0 - _EPS)
    return math.log(q) - math.log1p(-q)


@dataclass(frozen=True)
class MemoryParams:
    """How labels move a score (module docstring): `neighbours` read per request, the similarity `bandwidth`
    of their weights, the pseudo-count `prior` the router's own score is worth, the weight `structure` of the
    structural columns beside the embedding in the similarity (0: the embedding alone), whether the router's
    `slope` is fitted on the labels with its level (False: the level alone), the `slope_scale` the fitted slope
    is read at (1: as fitted; unused without `slope`), how far a move its neighbours disagree about shrinks
    (`shrink`; 0: not at all), the ridge `sources` that holds the combination with the artifact's per-source routers
    near the pooled router (0: no combination), and the `early_bandwidth` and `early_shrink` a memory of fewer than
    `early_labels` labels moves with (0: none). The defaults did best on the learning curve (MODEL_CARD.md,
    "Learning curve"). A memory file keeps the parameters it was written with; one written before a field existed
    reads its default."""

    neighbours: int = 100
    bandwidth: float = 0.1
    prior: float = 0.3
    structure: float = 0.3  # served from the columns the scorer keeps (0 before; files keep their own)
    slope: bool = True
    slope_scale: float = 0.5  # 1 before 2026-12-05
    shrink: float = 0.3  # 0 before 2026-12-05
    sources: float = 300.0  # 0 (not used) before 2026-12-05, late
    early_labels: int = 300  # below it `early_shrink` and `early_bandwidth` (0: never; before 2026-12-05, late)
    early_shrink: float = 0.9
    early_bandwidth: float = 0.125

    def __post_init__(self) -> None:
        if (self.neighbours < 1 or not self.bandwidth > 0 or not self.prior > 0 or not self.structure >= 0
                or not self.slope_scale > 0 or not self.shrink >= 0 or not self.sources >= 0
                or self.early_labels < 0 or not self.early_shrink >= 0 or not self.early_bandwidth > 0):
            raise ValueError("memory parameters must be positive (neighbours >= 1, structure, shrink, sources, "
                             f"early_labels and early_shrink >= 0), got {self}")

    def moving(self, labels: int) -> tuple[float, float]:
        """(bandwidth, shrink) a memory of `labels` labels moves scores with: the early ones below `early_labels`
        (fewer labels are trusted less), else `bandwidth` and `shrink`."""
        if labels < self.early_labels:
            return self.early_bandwidth, self.early_shrink
        return self.bandwidth, self.shrink


@dataclass(frozen=True)
class LabelMemory:
    """Labelled feature rows (`rows`, (n, d) float32; the first `embedding_dim` columns an L2-normalised
    embedding), their targets (`targets`, (n,) in [0, 1]: `gap_target`; NaN for a label that gives no gap, only
    pools' qualities) and the prompts' keys (`keys`, for counting conflicting labels; "" when unknown). Labels per
    pool (`router_models.serving.pool_labels`): `pools` names the columns of `qualities` ((n, len(pools)) in
    [0, 1], NaN where a label says nothing of that pool): a pool's name, or `pool_labels.MICRO` / `FLAGSHIP` for the
    micro and flagship quality of a two-pool label. Every label gives a target or a quality."""

    rows: FloatArray
    targets: Floats
    embedding_dim: int
    params: MemoryParams = MemoryParams()
    keys: tuple[str, ...] = ()
    pools: tuple[str, ...] = ()
    qualities: Floats | None = None

    def __post_init__(self) -> None:
        if self.rows.ndim != 2 or self.rows.shape[0] != self.targets.shape[0]:
            raise ValueError(f"{self.rows.shape} rows for {self.targets.shape} targets")
        if not 0 < self.embedding_dim <= self.rows.shape[1]:
            raise ValueError(f"embedding_dim {self.embedding_dim} outside the rows' {self.rows.shape[1]} columns")
        given = np.isfinite(self.targets)
        if not (np.all(np.isfinite(self.rows)) and np.all((self.targets[given] >= 0.0) & (self.targets[given] <= 1.0))):
            raise ValueError("memory rows must be finite and targets in [0, 1]")
        if self.keys and len(self.keys) != len(self.targets):
            raise ValueError(f"{len(self.keys)} keys for {len(self.targets)} labels")
        q = self.qualities
        if q is None:
            if self.pools or not np.all(given):
                raise ValueError("every label needs a target or a quality (and pools named their qualities)")
            return
        if q.shape != (len(self), len(self.pools)) or len(set(self.pools)) != len(self.pools):
            raise ValueError(f"qualities {q.shape} for {len(self)} labels of pools {self.pools}")
        known = np.isfinite(q)
        if not np.all((q[known] >= 0.0) & (q[known] <= 1.0)) or not np.all(given | known.any(axis=1)):
            raise ValueError("pool qualities must be in [0, 1], and every label needs a target or a quality")

    @classmethod
    def empty(cls, dim: int, embedding_dim: int, params: MemoryParams = MemoryParams()) -> LabelMemory:
        return cls(np.zeros((0, dim), np.float32), np.zeros(0), embedding_dim, params)

    def __len__(self) -> int:
        return int(self.targets.shape[0])

    def extended(self, rows: npt.NDArray[np.floating], targets: Sequence[float] | Floats,
                 keys: Sequence[str] = (), qualities: Sequence[Mapping[str, float]] = ()) -> LabelMemory:
        """A new memory with these labels appended (this one is left as it was); `qualities`: per new label, its
        pools' qualities (empty: none; a target NaN needs some)."""
        new_keys = tuple(keys) if keys else ("",) * len(targets)
        old_keys = self.keys if self.keys else ("",) * len(self)
        pools, table = self._pool_columns(len(targets), qualities)
        return LabelMemory(np.vstack([self.rows, np.asarray(rows, np.float32)]),
                           np.concatenate([self.targets, np.asarray(targets, np.float64)]), self.embedding_dim,
                           self.params, old_keys + new_keys, pools, table)

    def _pool_columns(self, added: int, qualities: Sequence[Mapping[str, float]]) -> tuple[tuple[str, ...],
                                                                                           Floats | None]:
        """(pools, qualities) of this memory with `added` labels of `qualities` appended (new pools: new columns)."""
        pools = tuple(dict.fromkeys([*self.pools, *(p for q in qualities for p in q)]))
        if not pools:
            return (), None
        table = np.full((len(self) + added, len(pools)), np.nan)
        if self.qualities is not None:
            table[:len(self), :len(self.pools)] = self.qualities
        for i, given in enumerate(qualities):
            for pool, value in given.items():
                table[len(self) + i, pools.index(pool)] = float(value)
        return pools, table

    def gap_labels(self) -> LabelMemory:
        """The labels that give a gap target, without pool columns (the two-pool score's memory; this memory itself
        when every label gives one and none names a pool)."""
        if self.qualities is None:
            return self
        keep = np.isfinite(self.targets)
        keys = tuple(k for k, kept in zip(self.keys, keep, strict=True) if kept) if self.keys else ()
        return LabelMemory(self.rows[keep], self.targets[keep], self.embedding_dim, self.params, keys)

    def conflicts(self, tolerance: float = 0.5) -> int:
        """Prompts (by key) labelled more than once whose targets are at least `tolerance` apart (the default:
        `needs_flagship` 0 against 1, targets 0.5 and 1)."""
        by_key: dict[str, list[float]] = defaultdict(list)
        for key, target in zip(self.keys, self.targets, strict=False):
            if key and np.isfinite(target):
                by_key[key].append(float(target))
        return sum(1 for v in by_key.values() if len(v) > 1 and max(v) - min(v) >= tolerance - 1e-9)


@dataclass(frozen=True)
class MemoryRouter:
    """A `LinearRouter` with a `LabelMemory` attached (module docstring): `predict_proba` as the router's, moved
    by the labels. `logits` are the router's on the labels and `source_logits` its per-source routers' (computed once
    each; (n, 0) when the combination is not used), `combination` the router read with them on the labels, `slope`
    and `level` the fitted `a` and `c` on the combination's logit, `back` the (a, c) of the router's logit alone (a
    moved score returns to the router's scale by it: the score the router alone would need for that gap
    probability; without a combination the two are the same), `residuals` the labels' against it, `unit` their
    similarity rows and `centre`, `spread` the structural columns' mean and spread over the labels (what `unit` was
    scaled by)."""

    base: LinearRouter
    memory: LabelMemory
    logits: Floats
    source_logits: Floats
    combination: Combination
    slope: float
    level: float
    back: tuple[float, float]
    residuals: Floats
    unit: FloatArray = field(repr=False)
    centre: Floats = field(repr=False)
    spread: Floats = field(repr=False)
    # the per-source routers folded into the combination once (`_fold`): a request's read logit is
    # combination.slope * logit(score) + _offset + row . _direction, one dot product instead of k
    _direction: Floats | None = field(init=False, repr=False, compare=False)
    _offset: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        direction, offset = _fold(self.base, self.combination)
        object.__setattr__(self, "_direction", direction)
        object.__setattr__(self, "_offset", offset)

    @classmethod
    def attach(cls, base: LinearRouter, memory: LabelMemory) -> MemoryRouter:
        """`memory`'s gap labels (`LabelMemory.gap_labels`: labels per pool alone move no score) on `base`."""
        memory = memory.gap_labels()
        if memory.rows.shape[1] != base.dim:
            raise ValueError(f"memory rows have {memory.rows.shape[1]} columns, the router reads {base.dim}")
        return cls._with(base, memory, _router_logits(base, memory.rows), _source_logits(base, memory, memory.rows))

    @classmethod
    def _with(cls, base: LinearRouter, memory: LabelMemory, logits: Floats, source_logits: Floats) -> MemoryRouter:
        combination = fit_combination(logits, source_logits, memory.targets, memory.params.sources)
        back = reading_scale(logits, memory.targets, memory.params)
        read = combination.logits(logits, source_logits)
        a, c = reading_scale(read, memory.targets, memory.params) if combination.used else back
        extra = memory.rows[:, memory.embedding_dim:].astype(np.float64)
        centre = extra.mean(axis=0) if len(memory) else np.zeros(extra.shape[1])
        spread = extra.std(axis=0) if len(memory) else np.ones(extra.shape[1])
        spread = np.where(spread > 1e-6, spread, np.inf)  # a column constant over the labels says nothing
        unit = similarity_rows(memory.rows, memory.embedding_dim, memory.params.structure, centre, spread)
        return cls(base, memory, logits, source_logits, combination, a, c, back,
                   memory.targets - _sigmoid(a * read + c), unit, centre, spread)

    @property
    def dim(self) -> int:
        return self.base.dim

    @property
    def reads_features(self) -> bool:
        """Whether `adjust` reads a request's whole feature row (the structural columns in the similarity, or the
        per-source routers), not its embedding alone."""
        return self.memory.params.structure > 0 or self.source_logits.shape[1] > 0

    def with_labels(self, rows: npt.NDArray[np.floating], targets: Sequence[float] | Floats,
                    keys: Sequence[str] = ()) -> MemoryRouter:
        """This router with more labels: only the new rows are scored by the router and its per-source routers
        (no model is refitted; the combination, slope, level and structural scaling are refitted over all labels:
        a few numbers)."""
        x = np.asarray(rows, np.float32)
        memory = self.memory.extended(x, targets, keys)
        return MemoryRouter._with(self.base, memory, np.concatenate([self.logits, _router_logits(self.base, x)]),
                                  np.vstack([self.source_logits, _source_logits(self.base, memory, x)]))

    def predict_proba(self, features: FloatArray) -> Floats:
        """One probability per row of `features` (n, dim), as `LinearRouter.predict_proba`."""
        return self.adjust(features, self.base.predict_proba(features))

    def adjust(self, features: npt.NDArray[np.floating], scores: Floats) -> Floats:
        """`scores` (the base router's, one per row of `features`: (m, dim) feature rows as the scorer computes
        them; (m, embedding_dim) embeddings when `reads_features` is False) moved by the labels. Row by row
        independent; a lone row's last steps run on Python floats (`_move_one`), the same formulas."""
        scores = np.asarray(scores, np.float64)
        if not len(self.memory):
            return scores
        p = self.memory.params
        width = self.dim if self.reads_features else self.memory.embedding_dim
        if features.shape[1] < width:
            raise ValueError(f"the memory reads {width} columns of a request, got {features.shape[1]}")
        query = similarity_rows(features[:, :width], self.memory.embedding_dim, p.structure, self.centre,
                                self.spread)
        sims = query @ self.unit.T
        near = nearest(sims, p.neighbours)
        bandwidth, shrink = p.moving(len(self.memory))
        if len(scores) == 1:  # the gateway's inline move: one row, without the (m, k) bookkeeping
            close, residuals = (sims[0], self.residuals) if near is None else (sims[0, near[0]],
                                                                               self.residuals[near[0]])
            weights = np.exp(np.subtract(close, 1.0, dtype=np.float64) / bandwidth)
            shift_one = neighbour_move_one(weights, residuals, p.prior, shrink)
            return np.asarray([self._move_one(features[0], float(scores[0]), shift_one)])
        close = sims if near is None else np.take_along_axis(sims, near, axis=1)
        weights = np.exp(np.subtract(close, 1.0, dtype=np.float64) / bandwidth)
        shift = neighbour_move(weights, self.residuals if near is None else self.residuals[near], p.prior, shrink)
        read = self.combination.slope * _logit(scores) + self._offset
        if self._direction is not None:
            read = read + np.asarray(features[:, :self.dim], np.float64) @ self._direction
        moved = _clip(_sigmoid(self.slope * read + self.level) + shift, _EPS, 1.0 - _EPS)
        back_slope, back_level = self.back
        return _sigmoid((_logit(moved) - back_level) / back_slope)

    def _move_one(self, row: npt.NDArray[np.floating], score: float, shift: float) -> float:
        """`adjust`'s last steps for one row on Python floats: numpy's per-call cost on one-element arrays is
        ten times the arithmetic (the same formulas; float64 either way, so equal to its last bits)."""
        read = self.combination.slope * _logit_of(score) + self._offset
        if self._direction is not None:
            read += float(np.dot(np.asarray(row[:self.dim], np.float64), self._direction))
        moved = min(max(_sigmoid_of(self.slope * read + self.level) + shift, _EPS), 1.0 - _EPS)
        back_slope, back_level = self.back
        return _sigmoid_of((_logit_of(moved) - back_level) / back_slope)


def _fold(base: LinearRouter, combination: Combination) -> tuple[Floats | None, float]:
    """(direction, offset) with combination.logits(z, base.sources.logits(x)) = slope z + offset + x . direction:
    the per-source routers' weights and biases read through the combination's weights once per memory (None: no
    per-source router is read)."""
    sources = base.sources
    if sources is None or not combination.used:
        return None, combination.level
    direction = sources.weights.astype(np.float64).T @ combination.weights
    return np.asarray(direction, np.float64), combination.level + float(sources.biases @ combination.weights)


def _source_logits(router: LinearRouter, memory: LabelMemory, x: npt.NDArray[np.floating]) -> Floats:
    """The router's per-source routers' logits on rows `x` when the memory combines them (`params.sources` > 0 and
    the artifact carries them), else (n, 0)."""
    if router.sources is None or memory.params.sources <= 0:
        return np.zeros((len(x), 0))
    return router.sources.logits(x)


def _router_logits(router: LinearRouter, x: npt.NDArray[np.floating]) -> Floats:
    return np.asarray(np.asarray(x, np.float64) @ router.weights.astype(np.float64) + router.bias, np.float64)
