"""A request's labelled neighbours in a label memory: the rows compared, the labels nearest, and the move they make.

Shared by the score's memory (`label_memory.MemoryRouter.adjust`) and the labels per pool
(`pool_labels.TierLabels.moves`); the formulas are in `label_memory`'s module docstring.

Contract:
- `similarity_rows(x, ...)`: float32 rows of unit length (the embedding, then the structural columns standardised and
  weighted), compared by dot product. The labels' rows are built once per memory; a request's per move.
- `nearest(sims, k)`: per row of similarities, the columns of its k largest: the set `np.argpartition(-sims, k - 1)`
  gives (a partition of the values and a comparison, about half its cost; where the k-th largest value is tied, the
  argpartition itself, so the same labels are read), in no set order; None when k covers every label (no selection).
- `neighbour_move(weights, residuals, prior, shrink)`: each row's move, float64; `neighbour_move_one` one row's.

These run per request, on the event loop for a memory of up to `label_memories.INLINE_LABELS` labels, on one-row
arrays where numpy's per-call cost (1-5 us) outweighs the arithmetic: hence one pass per step, no `np.clip` or
`np.finfo` per call, and no copies between float types beyond the float64 weights.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from router_models.serving.domain import row_norms

__all__ = ["nearest", "neighbour_move", "neighbour_move_one", "similarity_rows"]

Floats = npt.NDArray[np.float64]
FloatArray = npt.NDArray[np.float32]
Indices = npt.NDArray[np.intp]

_TINY = float(np.finfo(np.float64).tiny)


def similarity_rows(x: npt.NDArray[np.floating], embedding_dim: int, structure: float, centre: Floats,
                    spread: Floats) -> FloatArray:
    """Rows of unit length to compare by dot product: the embedding, then (with `structure` > 0) the structural
    columns standardised by `centre`, `spread` and weighted so that together they count `structure` against
    the embedding's 1 (zero rows stay zero). Built in one float32 array: each column's value is what normalising the
    embedding, appending the standardised columns in float64 and normalising the float32 row again gives."""
    emb = x[:, :embedding_dim]
    norms = _nonzero(row_norms(emb))
    if structure == 0 or x.shape[1] == embedding_dim:
        return np.asarray(emb / norms, np.float32)
    both = np.empty(x.shape, np.float32)
    np.divide(emb, norms, out=both[:, :embedding_dim])
    extra = np.subtract(x[:, embedding_dim:], centre, dtype=np.float64) / spread
    np.multiply(extra, structure / np.sqrt(extra.shape[1]), out=both[:, embedding_dim:])
    np.divide(both, _nonzero(row_norms(both)), out=both)
    return both


def _nonzero(norms: npt.NDArray[np.floating]) -> npt.NDArray[np.floating]:
    """`norms` with 0 read as 1 (a zero row stays zero); a lone nonzero norm as it is, without `np.where`."""
    if norms.size == 1 and norms.item() > 0:
        return norms
    return np.where(norms > 0, norms, 1.0)


def nearest(sims: FloatArray, k: int) -> Indices | None:
    """(m, k): for each row of `sims` (m, n), the columns of its k largest values (module docstring); None when
    k >= n (every column)."""
    m, n = sims.shape
    if k >= n:
        return None
    out = np.empty((m, k), np.intp)
    for i in range(m):  # rows are requests: one partition each, as argpartition does along axis 1
        row = sims[i]
        values = row.copy()
        values.partition(n - k)  # the method: `np.partition`'s wrapper costs more than the partition at 1,000
        top = (row >= values[n - k]).nonzero()[0]
        out[i] = top if len(top) == k else np.argpartition(-row, k - 1)[:k]
    return out


def neighbour_move(weights: Floats, residuals: Floats, prior: float, shrink: float) -> Floats:
    """Each row's move (`label_memory`'s module docstring): its neighbours' weighted mean residual against the
    pseudo-count `prior`, times m^2 / (m^2 + shrink se2), where se2 is the squared standard error of that mean.
    `residuals` broadcast against `weights` ((m, k))."""
    total = weights.sum(axis=1)
    weighted = weights * residuals
    summed = weighted.sum(axis=1)
    shift: Floats = summed / (total + prior)
    if shrink == 0:
        return shift
    total = np.maximum(total, _TINY)  # weights that underflowed: no move, and no 0 / 0
    mean = summed / total
    spread = np.maximum((weighted * residuals).sum(axis=1) / total - mean * mean, 0.0)  # residuals in [-1, 1]
    se2 = spread * (weights * weights).sum(axis=1) / (total * total)
    square = shift * shift
    keep = np.divide(square, square + shrink * se2, out=np.ones_like(square), where=square > 0)
    moved: Floats = shift * keep
    return moved


def neighbour_move_one(weights: Floats, residuals: Floats, prior: float, shrink: float) -> float:
    """`neighbour_move` of one row ((k,) weights and residuals): its four sums as dot products and the rest on
    Python floats (equal to the last bits of float64: the sums' order differs)."""
    total = float(weights.sum())
    weighted = weights * residuals
    summed = float(weighted.sum())
    shift = summed / (total + prior)
    if shrink == 0 or shift == 0:
        return shift
    total = max(total, _TINY)
    mean = summed / total
    spread = max(float(np.dot(weighted, residuals)) / total - mean * mean, 0.0)
    se2 = spread * float(np.dot(weights, weights)) / (total * total)
    square = shift * shift
    return shift * (square / (square + shrink * se2))
