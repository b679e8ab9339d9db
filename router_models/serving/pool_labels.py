"""Labels per pool: a label that says pool X answered a prompt well (or badly) moves X's predicted quality (the pool
map's P(good answer), `pool_map.quality`) for requests near that prompt, and no other pool's.

A label memory (`label_memory.LabelMemory`) keeps, beside each label's gap target, the qualities it gives per pool
(`LabelMemory.pools`, `qualities`; NaN where it says nothing of a pool). A label file's `"pools": {X: q, ...}` names
pools; its `micro` and `flagship` qualities (or `needs_flagship = p`: micro 1 - p, flagship 1) are kept as the
columns `MICRO` and `FLAGSHIP`, read as the first and the last tier of a `routing.tiers` policy (its micro and
flagship pools). A pool's own column comes first where both say something.

Contract:
- `PoolLabels.of(memory)`: the labels that give some pool's quality, with their similarity rows (as the score's
  memory builds them: `neighbours.similarity_rows`, the structural columns standardised over these labels); None
  when no label names a pool (a memory written before labels per pool: a tiers trade then shifts by the score's gap
  move, `policies.tiers.remembered`).
- `PoolLabels.on(tiers, predicted)`: the residuals of each tier's labels against the map's prediction of that tier on
  the label's own row (`predicted` (n, tiers): the quality model and placements the requests are predicted with), so
  the labels correct the placement where it is wrong and say nothing where it is right; recomputed when a placement
  or the map changes (a label counts against the pool as placed now).
- `TierLabels.moves(features)`: each tier's move for each request (feature rows as the scorer keeps them), its
  labels' neighbour move as the score's memory moves a score (`neighbours.neighbour_move`: the weighted mean
  residual of the `neighbours` most similar labels of that tier against the pseudo-count `prior`, shrunk where they
  disagree; `MemoryParams.moving` by that tier's label count). A tier with no label near a request keeps its
  prediction; a tier with no label at all moves by 0. Predicted quality + move, kept in [0, 1], is what the trade
  reads (`policies.tiers.moved`).

Cost per request: one (labels x columns) matrix-vector product for the similarities, then a partition of them per
tier (`neighbours.nearest`; none for a tier of no more labels than `neighbours`).
Numpy, deterministic, immutable.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from router_models.serving.label_memory import LabelMemory, MemoryParams
from router_models.serving.neighbours import nearest, neighbour_move, similarity_rows

__all__ = ["FLAGSHIP", "MICRO", "PoolLabels", "TierLabels"]

Floats = npt.NDArray[np.float64]
FloatArray = npt.NDArray[np.float32]

MICRO = "@micro"
"""The column of a two-pool label's micro quality: a `routing.tiers` policy's first tier."""
FLAGSHIP = "@flagship"
"""The column of a two-pool label's flagship quality: a `routing.tiers` policy's last tier."""


@dataclass(frozen=True)
class PoolLabels:
    """The labels of a memory that give some pool's quality (module docstring): `rows` (n, d), `qualities`
    (n, len(pools)) with NaN where a label says nothing of a pool, and their similarity rows (`unit`, from the
    structural columns' `centre` and `spread` over these labels)."""

    rows: FloatArray
    pools: tuple[str, ...]
    qualities: Floats
    embedding_dim: int
    params: MemoryParams
    unit: FloatArray = field(repr=False)
    centre: Floats = field(repr=False)
    spread: Floats = field(repr=False)

    @classmethod
    def of(cls, memory: LabelMemory) -> PoolLabels | None:
        if memory.qualities is None:
            return None
        keep = np.isfinite(memory.qualities).any(axis=1)
        rows = memory.rows[keep]
        extra = rows[:, memory.embedding_dim:].astype(np.float64)
        centre = extra.mean(axis=0) if len(rows) else np.zeros(extra.shape[1])
        spread = extra.std(axis=0) if len(rows) else np.ones(extra.shape[1])
        spread = np.where(spread > 1e-6, spread, np.inf)  # a column constant over the labels says nothing
        unit = similarity_rows(rows, memory.embedding_dim, memory.params.structure, centre, spread)
        return cls(rows, memory.pools, memory.qualities[keep], memory.embedding_dim, memory.params, unit, centre,
                   spread)

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    def columns(self, tiers: Sequence[str]) -> Floats:
        """(n, len(tiers)): each tier's quality by each label (its own column, else `MICRO` for the first tier and
        `FLAGSHIP` for the last), NaN where the label says nothing of it."""
        out = np.full((len(self), len(tiers)), np.nan)
        for t, pool in enumerate(tiers):
            names = [pool, *([MICRO] if t == 0 else []), *([FLAGSHIP] if t == len(tiers) - 1 else [])]
            for name in names:
                if name in self.pools:
                    given = self.qualities[:, self.pools.index(name)]
                    out[:, t] = np.where(np.isnan(out[:, t]), given, out[:, t])
        return out

    def on(self, tiers: Sequence[str], predicted: npt.NDArray[np.floating]) -> TierLabels:
        """These labels against `predicted` ((n, len(tiers)): each tier's predicted quality on each label's row)."""
        labelled = self.columns(tiers)
        if predicted.shape != labelled.shape:
            raise ValueError(f"{predicted.shape} predictions for {len(self)} labels of {len(tiers)} tiers")
        return TierLabels(self, tuple(tiers), labelled - np.asarray(predicted, np.float64))


@dataclass(frozen=True)
class TierLabels:
    """`labels` against one policy's `tiers` as predicted now: `residuals` (n, len(tiers)), NaN where a label says
    nothing of a tier."""

    labels: PoolLabels
    tiers: tuple[str, ...]
    residuals: Floats

    def counts(self) -> tuple[int, ...]:
        """Labels per tier."""
        return tuple(int(v) for v in np.isfinite(self.residuals).sum(axis=0))

    def moves(self, features: npt.NDArray[np.floating]) -> Floats:
        """(m, len(tiers)): each tier's move of its predicted quality for each of `features` ((m, d) feature rows as
        the scorer keeps them; the embedding alone suffices with `structure` 0). Row by row independent."""
        labels, p = self.labels, self.labels.params
        width = labels.rows.shape[1] if p.structure > 0 else labels.embedding_dim
        if features.shape[1] < width:
            raise ValueError(f"labels per pool read {width} columns of a request, got {features.shape[1]}")
        out = np.zeros((features.shape[0], len(self.tiers)))
        if not len(labels):
            return out
        query = similarity_rows(np.asarray(features[:, :width], np.float32), labels.embedding_dim, p.structure,
                                labels.centre, labels.spread)
        sims = query @ labels.unit.T
        for t in range(len(self.tiers)):
            have = np.flatnonzero(np.isfinite(self.residuals[:, t]))
            if not len(have):
                continue
            near = sims if len(have) == len(labels) else sims[:, have]
            chosen = nearest(near, p.neighbours)
            bandwidth, shrink = p.moving(len(have))
            close = near if chosen is None else np.take_along_axis(near, chosen, axis=1)
            weights = np.exp((close.astype(np.float64) - 1.0) / bandwidth)
            residuals = self.residuals[have, t]
            out[:, t] = neighbour_move(weights, residuals if chosen is None else residuals[chosen], p.prior, shrink)
        return out
