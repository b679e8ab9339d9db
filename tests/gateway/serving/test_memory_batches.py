"""The label-memory move batcher: moves that wait together share one pass, a memory whose move fails fails only its
own requests, and a request that left does not stop the others. The memory is random vectors: these tests are about
the batching, not about which prompt is harder."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import numpy as np
import numpy.typing as npt
import pytest

from gateway.serving.routing.memory_batches import MoveBatcher
from router_models.serving.classifier import LinearRouter
from router_models.serving.label_memory import LabelMemory, MemoryParams, MemoryRouter

DIM, EMBED = 12, 8


def _rows(n: int, seed: int) -> npt.NDArray[np.float32]:
    x = np.random.default_rng(seed).normal(size=(n, DIM)).astype(np.float32)
    x[:, :EMBED] /= np.linalg.norm(x[:, :EMBED], axis=1, keepdims=True)
    return x


def _memory(seed: int) -> MemoryRouter:
    router = LinearRouter(np.random.default_rng(seed).normal(size=DIM).astype(np.float32) * 0.3, -0.5)
    rows = _rows(50, seed)
    targets = np.random.default_rng(seed + 1).uniform(size=50)
    return MemoryRouter.attach(router, LabelMemory(rows, targets, EMBED, MemoryParams(bandwidth=0.5)))


async def test_moves_that_wait_together_share_one_batch_per_memory_and_match_lone_moves() -> None:
    batcher, memories, queries = MoveBatcher(), [_memory(1), _memory(2)], _rows(6, 9)
    asks = [(memories[i % 2], queries[i:i + 1], 0.2 + 0.1 * i) for i in range(6)]
    got = await asyncio.gather(*(batcher.move(m, row, score) for m, row, score in asks))
    want = [float(m.adjust(row, np.asarray([score]))[0]) for m, row, score in asks]
    assert got == pytest.approx(want, rel=1e-5)  # float32 similarities: a matrix product against vector products
    assert got != [score for _, _, score in asks]  # the memories moved them
    assert (batcher.batches, batcher.moves) == (1, 6)


async def test_a_memory_whose_move_fails_fails_its_own_requests_only() -> None:
    batcher, good = MoveBatcher(), _memory(1)
    bad = replace(good, unit=good.unit[:, :3])  # rows the query cannot be multiplied with
    query = _rows(1, 9)
    results = await asyncio.gather(batcher.move(bad, query, 0.3), batcher.move(good, query, 0.3),
                                   batcher.move(bad, query, 0.4), return_exceptions=True)
    assert batcher.batches == 1 and isinstance(results[0], ValueError) and isinstance(results[2], ValueError)
    assert results[1] == pytest.approx(float(good.adjust(query, np.asarray([0.3]))[0]), rel=1e-5)
    assert await batcher.move(good, query, 0.3) == pytest.approx(float(good.adjust(query, np.asarray([0.3]))[0]))


async def test_a_request_that_left_does_not_stop_the_others() -> None:
    batcher, memory, query = MoveBatcher(), _memory(1), _rows(1, 9)
    leaving = asyncio.ensure_future(batcher.move(memory, query, 0.3))
    staying = asyncio.ensure_future(batcher.move(memory, query, 0.4))
    await asyncio.sleep(0)  # both are waiting in the first batch
    leaving.cancel()
    assert await staying == pytest.approx(float(memory.adjust(query, np.asarray([0.4]))[0]), rel=1e-5)
    assert leaving.cancelled() and batcher.moves == 2
