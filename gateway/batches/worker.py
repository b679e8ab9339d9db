"""A gateway process's batch worker: takes lines of the open batches from the shared queue, answers each through the
lane (`runner`), keeps its answer once, and ends batches that are due (`finalize`).

Each process is one consumer of every batch's stream (`queue`), with at most the policy's `batches.lines_in_flight`
lines of its own at once. Every `sweep_s` it also: ends batches due (every line answered, cancelled and idle, or past
their window), takes over lines another consumer took more than `batches.claim_after_s` ago without acknowledging
them (XAUTOCLAIM: that worker died or hangs), fails batches whose validation began that long ago and never ended
(the gateway creating them stopped), and deletes the files expired (`expiry`). A line is acknowledged only after
its answer is kept, so a worker that dies mid-line loses nothing; a line answered twice keeps its first answer
(`BatchStore.answer`) and is billed once (`runner.request_id`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import replace

from backends.background import stop
from gateway.batches.expiry import FileExpiry
from gateway.batches.finalize import Finalizer, ending_of
from gateway.batches.metrics import BatchMetrics
from gateway.batches.queue import LineQueue, Taken
from gateway.batches.runner import LineRunner
from gateway.batches.store import BatchStore
from gateway.control.policy.policy_holder import PolicyHolder
from gateway.logs import LogThrottle
from gateway.redis_client import REDIS_FAILURES

__all__ = ["BatchWorker"]

log = logging.getLogger("cascade.batches")


class BatchWorker:
    """Owns its task (`start` / `aclose`) and the lines it runs; shares the rest. `consumer` names it in the group;
    `expiry`: the files' sweep (None: files are not deleted here)."""

    def __init__(self, store: BatchStore, queue: LineQueue, runner: LineRunner, finalizer: Finalizer,
                 policies: PolicyHolder, metrics: BatchMetrics | None, consumer: str, *, sweep_s: float = 1.0,
                 requeue_pause_s: float = 0.5, clock: Callable[[], float] = time.time,
                 expiry: FileExpiry | None = None) -> None:
        self._store = store
        self._queue = queue
        self._runner = runner
        self._finalizer = finalizer
        self._policies = policies
        self._metrics = metrics
        self.consumer = consumer
        self._sweep_s = sweep_s
        self._pause_s = requeue_pause_s
        self._clock = clock
        self._expiry = expiry
        self._running: dict[asyncio.Task[None], Taken] = {}  # the lines being answered
        self._task: asyncio.Task[None] | None = None
        self._paused_until = 0.0
        self._turn = 0
        self._unreachable = LogThrottle()  # Redis down: one line every 30 s, not a traceback every pass

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name=f"batch-worker-{self.consumer}")

    async def aclose(self) -> None:
        """Stop taking lines, cancel those running and put them back on the queue, where any worker takes them at
        once (a line whose engine call had finished is answered again, and billed once: `runner.request_id`).
        One that cannot be put back (Redis unreachable) stays unacknowledged: reclaimed after `claim_after_s`."""
        await stop(self._task)
        running = dict(self._running)
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        for task, taken in running.items():
            if task.cancelled():
                with contextlib.suppress(Exception):
                    await self._give_back(taken)

    async def _give_back(self, taken: Taken) -> None:
        batch = await self._store.batch(taken.batch_id)
        if batch is not None and batch.status in ("in_progress", "cancelling"):  # a finished batch's stream is gone
            await self._queue.requeue(taken)

    async def _loop(self) -> None:
        swept = 0.0
        while True:
            try:
                if time.monotonic() - swept >= self._sweep_s:
                    swept = time.monotonic()
                    await self.sweep()
                await self.take_once()
            except asyncio.CancelledError:
                raise
            except REDIS_FAILURES as exc:
                passes = self._unreachable.due("redis")
                if passes is not None:
                    log.warning("batch worker %s: Redis unreachable (%s); no line is taken until it answers, %d "
                                "pass(es) since the last line", self.consumer, exc, passes)
                await asyncio.sleep(self._sweep_s)
                continue
            except Exception:
                log.exception("batch worker %s: a pass failed; trying again", self.consumer)
                await asyncio.sleep(self._sweep_s)
                continue
            if self._unreachable.forget(lambda key: True):
                log.info("batch worker %s: Redis answers again; taking lines", self.consumer)

    def _free(self) -> int:
        return self._policies.current.policy.batches.lines_in_flight - len(self._running)

    async def take_once(self, block_ms: int = 200) -> int:
        """Take and start as many new lines as this worker has room for; how many it started. Full, it waits (at
        most `block_ms`) for a line to end; with nothing to take, it waits `block_ms`."""
        free = self._free()
        if free < 1:  # full: the next line starts as soon as one ends
            await asyncio.wait(list(self._running), timeout=block_ms / 1000, return_when=asyncio.FIRST_COMPLETED)
            return 0
        ids = await self._store.open_ids()
        taken = []
        if ids and time.monotonic() >= self._paused_until:
            self._turn = (self._turn + 1) % len(ids)  # each pass starts at the next batch: batches share the worker
            taken = await self._queue.take(ids[self._turn:] + ids[:self._turn], self.consumer, free)
        for each in taken:
            self._spawn(each)
        if not taken:
            await asyncio.sleep(block_ms / 1000)
        return len(taken)

    async def sweep(self) -> None:
        """End the batches due, take over lines other consumers left unacknowledged too long, and delete the files
        expired."""
        claim_after = self._policies.current.policy.batches.claim_after_s
        await self._fail_interrupted(self._clock() - claim_after)
        if self._expiry is not None:
            await self._expiry.sweep()
        for batch_id in await self._store.open_ids():
            batch = await self._store.batch(batch_id)
            if batch is None:
                await self._store.closed(batch_id)
                continue
            due = ending_of(batch, self._clock())
            if due is not None and (due != "cancelled" or await self._queue.pending(batch_id) == 0):
                await self._finalizer.finish(batch_id)
            elif batch.status in ("in_progress", "cancelling") and (free := self._free()) > 0:
                # a cancelling batch's lines a dead worker holds are taken over too (and acknowledged unanswered):
                # until none is pending, the batch cannot end
                for each in await self._queue.reclaim(batch_id, self.consumer, claim_after, free):
                    self._spawn(each)

    async def _fail_interrupted(self, before: float) -> None:
        """Fail the batches whose validation began before `before` and never ended (the gateway creating them
        stopped): none of their lines was taken (they were never open), so the client creates them again."""
        for batch_id in await self._store.validating_since(before):
            batch = await self._store.batch(batch_id)
            if batch is not None and batch.status == "validating":
                error = {"code": "validation_interrupted", "message": "The gateway stopped while validating this "
                         "batch; create it again.", "param": None, "line": None}
                await self._store.put_batch(replace(batch, errors=(error,)).moved("failed", int(self._clock())))
                await self._queue.drop(batch_id)
            if batch is not None:
                await self._store.release(batch.input_file_id, batch_id)
            await self._store.validated(batch_id)

    def _spawn(self, taken: Taken) -> None:
        task = asyncio.create_task(self._handle_logged(taken))
        self._running[task] = taken
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._running.pop(task, None)

    async def _handle_logged(self, taken: Taken) -> None:
        try:
            await self.handle(taken)
        except Exception:  # unacknowledged: another pass reclaims it after `claim_after_s`
            log.exception("batch %s: line %d failed in the worker", taken.batch_id, taken.line.index)

    async def handle(self, taken: Taken) -> None:
        """Answer one line and acknowledge it; a line of a batch no longer in progress is acknowledged unanswered
        (cancelled, or past its window: the finalizer writes its expiry); one the lane could not send goes back."""
        batch = await self._store.batch(taken.batch_id)
        if batch is None or batch.status != "in_progress" or self._clock() >= batch.expires_at:
            await self._queue.done(taken)
            self._count("skipped")
            return
        outcome = await self._runner.run(batch, taken.line)
        if outcome.retry:
            await self._queue.requeue(taken)
            if not outcome.preempted:  # a preempted line's pool is back once its interactive load ends: the lane
                self._paused_until = time.monotonic() + self._pause_s  # holds the next lines until then
            self._count("requeued")
            return
        kept, all_answered = await self._store.answer(batch.id, taken.line.index, outcome.line, outcome.ok,
                                                      outcome.tokens)
        await self._queue.done(taken)
        self._count(("completed" if outcome.ok else "failed") if kept else "duplicate")
        if all_answered:
            await self._finalizer.finish(batch.id)

    def _count(self, status: str) -> None:
        if self._metrics is not None:
            self._metrics.line(status)
