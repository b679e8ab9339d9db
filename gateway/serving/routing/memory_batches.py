"""Label-memory moves computed in a worker thread, batched: what arrives while one batch is computed is the next.

A move reads its memory's whole (labels x columns) matrix once (`MemoryRouter.adjust`); past a few thousand labels
that is memory traffic more than arithmetic (3 ms a request at 30,000 labels on a 2-vCPU AMD EPYC). `adjust` takes a
batch of rows, so the requests that wait together share one pass over each memory's matrix. No request waits for a
batch to fill: the first is sent at once, and those that arrive while it is computed go together next, so the
batches are as large as the load makes them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from router_models.serving.label_memory import MemoryRouter

__all__ = ["MoveBatcher"]


@dataclass(frozen=True)
class _Move:
    attached: MemoryRouter
    row: npt.NDArray[np.float32]  # (1, columns): the request's row as the memory reads it
    score: float
    future: asyncio.Future[float]


class MoveBatcher:
    """Moves scores by label memories in a worker thread, one batch at a time (module docstring). Counts the
    batches it computed (`batches`) and the moves in them (`moves`), and tells `on_batch` each batch's size (the
    gateway's metrics: `cascade_label_memory_batch_size`)."""

    def __init__(self) -> None:
        self._waiting: list[_Move] = []
        self._draining: asyncio.Task[None] | None = None
        self.batches = 0
        self.moves = 0
        self.on_batch: Callable[[int], None] | None = None

    async def move(self, attached: MemoryRouter, row: npt.NDArray[np.float32], score: float) -> float:
        """`score` moved by `attached` for the request of feature `row`; raises what the move raised."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[float] = loop.create_future()
        self._waiting.append(_Move(attached, row, score, future))
        if self._draining is None:
            self._draining = loop.create_task(self._drain(), name="label-memory-moves")
        return await future

    async def _drain(self) -> None:
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, []
                self.batches, self.moves = self.batches + 1, self.moves + len(batch)
                if self.on_batch is not None:
                    self.on_batch(len(batch))
                try:
                    results = await asyncio.to_thread(_compute, batch)
                except Exception as exc:  # the worker could not run it at all: every request hears why
                    results = [exc] * len(batch)
                for m, result in zip(batch, results, strict=True):
                    if m.future.done():  # a request that left has cancelled its future
                        continue
                    if isinstance(result, Exception):
                        m.future.set_exception(result)
                    else:
                        m.future.set_result(result)
        finally:
            self._draining = None


def _compute(batch: list[_Move]) -> list[float | Exception]:
    """Every move of `batch`, one `adjust` per memory in it (worker thread); a memory whose move raised gives its
    requests the error, the others their scores."""
    out: list[float | Exception] = [0.0] * len(batch)
    groups: dict[int, list[int]] = {}
    for i, m in enumerate(batch):
        groups.setdefault(id(m.attached), []).append(i)
    for members in groups.values():
        attached = batch[members[0]].attached
        try:
            moved = attached.adjust(np.vstack([batch[i].row for i in members]),
                                    np.asarray([batch[i].score for i in members], np.float64))
        except Exception as exc:
            for i in members:
                out[i] = exc
            continue
        for i, score in zip(members, moved, strict=True):
            out[i] = float(score)
    return out
