"""The scorer's worker threads: each takes its next batch off one queue itself and runs it.

Contract: `put(item)` (from any thread; the scorer's event loop) queues an item and wakes one idle thread. A thread
takes the first item waiting, then whatever else waits, up to `max_batch` items, optionally waits up to `max_wait_s`
for more, and calls `run(batch, idle)` with them; `idle` says the first item came while the thread waited for work
(so its wait so far is the thread's wake-up, not a queue's). While it runs, new items queue up and form the next
batch, taken by the next thread free. At most `workers` batches run at once. `run` owns the batch: it must answer
every item (the scorer posts the answers back to its event loop) and must not raise (what it raises is logged, the
thread goes on).

Why threads that take their own batches (and not collector tasks on the event loop handing each batch to a thread
pool): each batch then costs the event loop one callback (the answers, `loop.call_soon_threadsafe`) instead of a
collector task's wake-up, an executor hand-off and the futures chained back, and a thread goes on to its next batch
without waiting for the loop to come round. In a gateway busy with distinct prompts the loop comes round late: there
a batch of 5 texts held a collector ~9 ms for ~1.5 ms of model CPU, and 85% of the texts went to the overflow model
for having waited (BENCHMARKS.md, "The scorer's threads and the GIL"). After posting its answers a thread yields the
GIL once (`time.sleep(0)`), so the loop takes them before the thread's next batch does.
`close()` stops the threads once their batch in flight is done and gives back the items never taken.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["BatchThreads"]

T = TypeVar("T")
_log = logging.getLogger(__name__)


class _Stop:
    """The queue's stop marker: one per thread, each thread ends at the first it takes."""


_STOP = _Stop()


class BatchThreads(Generic[T]):
    """`workers` daemon threads named `name`-k, started at the first `put`, each running `run` on the batches it
    takes (module docstring). Thread-safe. The owner must `close()` (and may `join()`)."""

    def __init__(self, run: Callable[[list[T], bool], None], workers: int, max_batch: int, max_wait_s: float = 0.0,
                 name: str = "batch") -> None:
        if workers < 1 or max_batch < 1:
            raise ValueError(f"workers and max_batch must be >= 1, got {workers}, {max_batch}")
        self._run = run
        self._workers = workers
        self._max_batch = max_batch
        self._max_wait_s = max_wait_s
        self._name = name
        self._queue: queue.SimpleQueue[T | _Stop] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._start_lock = threading.Lock()
        self._closed = False

    def put(self, item: T) -> None:
        """Queue `item` for the next batch. Raises RuntimeError once closed."""
        if self._closed:
            raise RuntimeError("batch threads are closed")
        if not self._threads:
            self._start()
        self._queue.put(item)

    def _start(self) -> None:
        with self._start_lock:
            if self._threads:
                return
            threads = [threading.Thread(target=self._work, name=f"{self._name}-{k}", daemon=True)
                       for k in range(self._workers)]
            for thread in threads:
                thread.start()
            self._threads = threads

    def _work(self) -> None:
        while True:
            batch, idle, stop = self._take()
            if batch:
                try:
                    self._run(batch, idle)
                except Exception:  # `run` answers its own errors; anything else must not end the thread
                    _log.exception("a scoring batch failed outside the model call")
                time.sleep(0)  # let the event loop take the GIL for the answers before this thread takes the next batch
            if stop:
                return

    def _take(self) -> tuple[list[T], bool, bool]:
        """The next batch (blocking until its first item), whether the thread waited for that first item, and
        whether this thread's stop marker was taken."""
        idle = False
        try:
            first = self._queue.get_nowait()
        except queue.Empty:
            idle = True
            first = self._queue.get()
        if isinstance(first, _Stop):
            return [], idle, True
        batch: list[T] = [first]
        deadline = time.monotonic() + self._max_wait_s
        while len(batch) < self._max_batch:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    item = self._queue.get(timeout=remaining)
                except queue.Empty:
                    break
            if isinstance(item, _Stop):
                return batch, idle, True
            batch.append(item)
        return batch, idle, False

    def close(self) -> list[T]:
        """Stop every thread after its batch in flight; the items still queued, never to be run. Idempotent."""
        if self._closed:
            return []
        self._closed = True
        left: list[T] = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if not isinstance(item, _Stop):
                left.append(item)
        for _ in self._threads:
            self._queue.put(_STOP)
        return left

    def join(self, timeout: float | None = None) -> None:
        """Wait for the threads to end (after `close`)."""
        for thread in self._threads:
            thread.join(timeout)
