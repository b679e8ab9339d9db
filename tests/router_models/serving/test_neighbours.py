"""A label memory's move per request (`neighbours`, `MemoryRouter.adjust`, `memory_apply.gap_move`) gives what the
computation it replaced gave: the same float32 similarity rows bit for bit, the same neighbours (ties included), and
moved scores and gap moves equal to float64's last bits, on a memory of real size (1,000 labels of 384 + 22 columns,
seven per-source routers) and on one no larger than its neighbour count.

The reference below is the earlier code, kept verbatim here (argpartition per row, the per-source routers' logits
then the combination, numpy on one-element arrays). Vectors are random: this tests arithmetic, not quality."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from router_models.serving.classifier import LinearRouter, SourceRouters
from router_models.serving.label_memory import LabelMemory, MemoryParams, MemoryRouter
from router_models.serving.memory_apply import gap_move, gap_moves
from router_models.serving.neighbours import nearest, similarity_rows

EMBED, EXTRA, SOURCES = 384, 22, 7
_EPS = 1e-6
# float64 sums taken in another order (dot products against pairwise sums) and Python's exp/log against numpy's:
# a few units in the last place of float64, far below float32's 6e-8
WITHIN = 1e-12

Floats = npt.NDArray[np.float64]


def _old_unit_rows(x: npt.NDArray[np.floating]) -> npt.NDArray[np.float32]:
    norms = np.sqrt(np.add.reduce(x * x, axis=1, keepdims=True))
    return np.asarray(x / np.where(norms > 0, norms, 1.0), np.float32)


def _old_similarity_rows(x: npt.NDArray[np.floating], embedding_dim: int, structure: float, centre: Floats,
                         spread: Floats) -> npt.NDArray[np.float32]:
    emb = _old_unit_rows(x[:, :embedding_dim])
    if structure == 0 or x.shape[1] == embedding_dim:
        return emb
    extra = (np.asarray(x[:, embedding_dim:], np.float64) - centre) / spread
    both = np.hstack([emb, (structure / np.sqrt(extra.shape[1])) * extra]).astype(np.float32)
    return _old_unit_rows(both)


def _old_neighbour_move(weights: Floats, residuals: Floats, prior: float, shrink: float) -> Floats:
    total = weights.sum(axis=1)
    weighted = weights * residuals
    summed = weighted.sum(axis=1)
    shift = np.asarray(summed / (total + prior), np.float64)
    if shrink == 0:
        return shift
    total = np.maximum(total, np.finfo(np.float64).tiny)
    mean = summed / total
    spread = np.maximum((weighted * residuals).sum(axis=1) / total - mean * mean, 0.0)
    se2 = spread * (weights * weights).sum(axis=1) / (total * total)
    square = shift * shift
    keep = np.divide(square, square + shrink * se2, out=np.ones_like(square), where=square > 0)
    return np.asarray(shift * keep, np.float64)


def _sigmoid(z: Floats) -> Floats:
    return np.asarray(1.0 / (1.0 + np.exp(-np.clip(z, -40.0, 40.0))), np.float64)


def _logit(p: Floats) -> Floats:
    q = np.clip(p, _EPS, 1.0 - _EPS)
    return np.asarray(np.log(q) - np.log1p(-q), np.float64)


def _old_adjust(m: MemoryRouter, features: npt.NDArray[np.float32], scores: Floats) -> Floats:
    p = m.memory.params
    width = m.dim if m.reads_features else m.memory.embedding_dim
    query = _old_similarity_rows(features[:, :width], m.memory.embedding_dim, p.structure, m.centre, m.spread)
    sims = query @ m.unit.T
    k = min(p.neighbours, sims.shape[1])
    near = np.argpartition(-sims, k - 1, axis=1)[:, :k]
    bandwidth, shrink = p.moving(len(m.memory))
    weights = np.exp((np.take_along_axis(sims, near, axis=1).astype(np.float64) - 1.0) / bandwidth)
    shift = _old_neighbour_move(weights, m.residuals[near], p.prior, shrink)
    sources = (m.base.sources.logits(features[:, :m.dim]) if m.base.sources is not None and m.combination.used
               else np.zeros((len(scores), 0)))
    read = m.combination.logits(_logit(scores), sources)
    moved = np.clip(_sigmoid(m.slope * read + m.level) + shift, _EPS, 1.0 - _EPS)
    back_slope, back_level = m.back
    return _sigmoid((_logit(moved) - back_level) / back_slope)


def _memory(rng: np.random.Generator, labels: int, duplicates: int = 0) -> tuple[MemoryRouter, npt.NDArray[np.float32]]:
    """A memory of `labels` random labels (the last `duplicates` copies of the first: one prompt labelled again and
    again, so a request equal to it ties at the neighbours' cut) on a random router with per-source routers, and
    requests: random rows, then the duplicated label's."""
    dim = EMBED + EXTRA
    emb = rng.normal(size=(labels + 40, EMBED))
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    rows = np.hstack([emb, rng.gamma(2.0, 3.0, size=(labels + 40, EXTRA))]).astype(np.float32)
    rows[:, EMBED + 3] = 1.0  # a structural column constant over the labels (spread inf: it says nothing)
    rows[labels - duplicates:labels] = rows[0]
    rows[-1] = rows[0]
    sources = SourceRouters(tuple(f"s{i}" for i in range(SOURCES)),
                            rng.normal(scale=0.05, size=(SOURCES, dim)).astype(np.float32), rng.normal(size=SOURCES))
    router = LinearRouter(rng.normal(scale=0.05, size=dim).astype(np.float32), -0.5, sources)
    targets = np.clip(0.55 + 0.5 * emb[:labels, 0] + rng.normal(scale=0.15, size=labels), 0.0, 1.0)
    memory = LabelMemory.empty(dim, EMBED, MemoryParams()).extended(rows[:labels], targets)
    return MemoryRouter.attach(router, memory), rows[labels:]


@pytest.mark.parametrize(("labels", "duplicates"), [(1000, 150), (5000, 0), (80, 0), (250, 0)])
def test_a_move_is_the_earlier_computations_one_request_at_a_time_and_in_batches(labels: int,
                                                                                duplicates: int) -> None:
    rng = np.random.default_rng(labels)
    attached, requests = _memory(rng, labels, duplicates)
    assert attached.reads_features and attached.combination.used and len(attached.combination.weights) == SOURCES
    scores = rng.uniform(0.02, 0.98, size=len(requests))
    # one request at a time (the gateway's inline move) and in a batch (its worker thread's): a batch's similarities
    # are a matrix product, a lone request's a matrix-vector one (float32 sums in another order), so each is compared
    # with the earlier code run the same way
    alone = [attached.adjust(requests[i:i + 1], scores[i:i + 1])[0] for i in range(len(requests))]
    want_alone = [_old_adjust(attached, requests[i:i + 1], scores[i:i + 1])[0] for i in range(len(requests))]
    np.testing.assert_allclose(alone, want_alone, rtol=0, atol=WITHIN)
    want = _old_adjust(attached, requests, scores)
    np.testing.assert_allclose(attached.adjust(requests, scores), want, rtol=0, atol=WITHIN)
    assert float(np.median(np.abs(want - scores))) > 1e-3  # the labels do move these scores
    np.testing.assert_allclose([gap_move(attached, float(s), float(w)) for s, w in zip(scores, want, strict=True)],
                               gap_moves(attached, scores, want), rtol=0, atol=WITHIN)


def test_similarity_rows_are_the_earlier_ones_bit_for_bit() -> None:
    rng = np.random.default_rng(3)
    attached, requests = _memory(rng, 1000)
    p = attached.memory.params
    for x in (requests, requests[:1], np.zeros((1, EMBED + EXTRA), np.float32), attached.memory.rows):
        got = similarity_rows(x, EMBED, p.structure, attached.centre, attached.spread)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, _old_similarity_rows(x, EMBED, p.structure, attached.centre,
                                                                attached.spread))
    np.testing.assert_array_equal(similarity_rows(requests, EMBED, 0.0, attached.centre, attached.spread),
                                  _old_unit_rows(requests[:, :EMBED]))


def test_the_nearest_labels_are_argpartitions_set_ties_at_the_cut_included() -> None:
    rng = np.random.default_rng(4)
    sims = rng.normal(size=(6, 1000)).astype(np.float32)
    sims[1, :150] = 0.5  # 150 equal values straddle the cut of 100 (at least 100 of them are the largest)
    sims[1, 150:] = np.minimum(sims[1, 150:], 0.4)
    sims[2, :99] = 9.0  # the cut itself tied: 99 above it, then 3 equal values for the last place
    sims[2, 99:102] = 5.0
    sims[2, 102:] = np.minimum(sims[2, 102:], 4.0)
    got = nearest(sims, 100)
    assert got is not None and got.shape == (6, 100)
    want = np.argpartition(-sims, 99, axis=1)[:, :100]
    for g, w in zip(got, want, strict=True):
        assert set(g.tolist()) == set(w.tolist())
    assert nearest(sims, 1000) is None and nearest(sims, 5000) is None  # every label: no selection
