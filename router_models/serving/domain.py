"""How close a request is to what the router was trained and evaluated on: an in-domain figure in [0, 1].

A `DomainReference` holds a sample of the training prompts' embeddings (`rows`: unit vectors, float16, an equal
number per public source) and a monotone calibration. For a request with embedding e (the router's own, as the
scorer computed it to score the request: nothing is embedded twice):

    s = mean of the `neighbours` largest cosine similarities e . r_j over the reference rows
    in_domain = C(s), C increasing and piecewise linear through the knots (`knots`, `levels`), clamped to [0, 1]

The calibration C is measured leave-one-source-out (`router_models.training.domain_build`): for each public source
S, a reference of the other sources scores S's prompts (held out: traffic of a kind the router never saw) and
prompts of the other sources that are not in the reference (in sample: new traffic of the kinds it was trained
on). C is the distribution function of s over both, pooled, each fold and each side weighing the same: in_domain
is the share of that traffic less similar to the training data than this request. So held-out traffic spreads
over the low part of the range and in-sample traffic over the high part, each over much of it (how much they
overlap is how alike the sources are: MODEL_CARD.md). The router's quality figures (APGR, the quality curve) are
measured on held-out sources; a low figure says the request is like the held-out traffic whose quality varied
most from source to source, not like the training data.

Cost per request: one (n_rows x dim) matrix-vector product and a partial sort: about 0.1 ms for 2,100 rows
of 384 (BENCHMARKS.md, "In-domain figure"); a batch of up to `_ROW_BY_ROW` requests takes one product each (a
matrix product first copies the whole reference into BLAS's packed layout: several times one request's cost).
Immutable; numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

__all__ = ["DomainReference", "row_norms", "unit_rows"]

Floats = npt.NDArray[np.float64]
# Up to this many embeddings a call are compared with the reference row by row: measured on a 2-vCPU AMD EPYC, 2 to 4
# embeddings cost 0.4-0.65 ms in one matrix product (its packing of the reference) against 0.08-0.1 ms each alone;
# from about 8 the matrix product is as cheap
_ROW_BY_ROW = 6


def row_norms(x: npt.NDArray[np.floating]) -> npt.NDArray[np.floating]:
    """(n, 1): each row's L2 norm, as `np.linalg.norm(x, axis=1, keepdims=True)` computes it for real rows (the same
    sum of squares and square root, so the same values) without its dispatch, a few us a call on one-row arrays."""
    norms: npt.NDArray[np.floating] = np.sqrt(np.add.reduce(x * x, axis=1, keepdims=True))
    return norms


def unit_rows(x: npt.NDArray[np.floating]) -> npt.NDArray[np.float32]:
    """Rows scaled to unit length (zero rows stay zero)."""
    x = np.asarray(x, np.float32)
    norms = row_norms(x)
    return np.asarray(x / np.where(norms > 0, norms, 1.0), np.float32)


@dataclass(frozen=True)
class DomainReference:
    """Reference embeddings (`rows`, (n, dim), unit length; stored float16) and the calibration of their
    similarity: `knots` (similarities, strictly increasing) mapped to `levels` (figures, increasing from 0 to 1)
    (module docstring). `sources` names the public sources the rows come from."""

    rows: npt.NDArray[np.float16]
    neighbours: int
    knots: tuple[float, ...]
    levels: tuple[float, ...]
    sources: tuple[str, ...] = ()
    _rows32: npt.NDArray[np.float32] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.rows.ndim != 2 or self.rows.shape[0] < 1:
            raise ValueError(f"a domain reference needs rows (n >= 1, dim), got {self.rows.shape}")
        if not 1 <= self.neighbours <= self.rows.shape[0]:
            raise ValueError(f"neighbours must be in [1, {self.rows.shape[0]}], got {self.neighbours}")
        knots, levels = np.asarray(self.knots, np.float64), np.asarray(self.levels, np.float64)
        if len(knots) < 2 or len(knots) != len(levels) or not (np.all(np.isfinite(knots))
                                                               and np.all(np.isfinite(levels))):
            raise ValueError(f"the calibration needs two knots or more and a level each, got {len(knots)} and "
                             f"{len(levels)}")
        if np.any(np.diff(knots) <= 0) or np.any(np.diff(levels) < 0) or levels[0] < 0 or levels[-1] > 1:
            raise ValueError("the calibration must rise: knots strictly, levels within [0, 1]")
        rows32 = np.asarray(self.rows, np.float32)
        if not np.all(np.isfinite(rows32)):
            raise ValueError("domain reference rows must be finite")
        object.__setattr__(self, "_rows32", rows32)

    @property
    def dim(self) -> int:
        return int(self.rows.shape[1])

    def similarity(self, embeddings: npt.NDArray[np.floating]) -> Floats:
        """s per row of `embeddings` (m, dim): the mean of its `neighbours` largest cosine similarities."""
        e = np.asarray(embeddings, np.float32)
        if e.ndim == 1:
            e = e[None, :]
        if e.shape[1] != self.dim:
            raise ValueError(f"expected (m, {self.dim}) embeddings, got {e.shape}")
        unit = unit_rows(e)
        rows = self._rows32.T
        # a few rows: one matrix-vector product each, as a lone request's (the same values); a matrix product would
        # first copy the whole reference into the BLAS's packed layout, 3.2 MB at 2,100 rows of 384, each call
        sims = (np.vstack([unit[i : i + 1] @ rows for i in range(len(unit))]) if 0 < len(unit) <= _ROW_BY_ROW
                else unit @ rows)
        k = self.neighbours
        top = np.partition(sims, sims.shape[1] - k, axis=1)[:, -k:]
        return np.asarray(top.mean(axis=1), np.float64)

    def calibrate(self, similarity: Floats) -> Floats:
        """The in-domain figure of similarities `s`: C(s) in [0, 1] (the first level below the first knot, the last
        above the last)."""
        return np.asarray(np.interp(np.asarray(similarity, np.float64), self.knots, self.levels), np.float64)

    def in_domain(self, embeddings: npt.NDArray[np.floating]) -> Floats:
        """The in-domain figure per row of `embeddings` (m, dim) or of one vector (dim,)."""
        return self.calibrate(self.similarity(embeddings))
