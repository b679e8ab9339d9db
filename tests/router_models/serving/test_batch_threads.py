"""The scorer's worker threads: each takes its own batches off one queue, at most `workers` run at once, a failed
batch does not end a thread, and `close` stops them and gives back what was never taken."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from router_models.serving.batch_threads import BatchThreads


class Recorder:
    """`run` for the threads: records each batch, its `idle` flag and its thread; with `hold`, each batch waits for
    `release` (set it to let them all through) and `started` counts the batches begun, so a test knows a thread is
    busy without timing it."""

    def __init__(self, hold: bool = False, fail_on: str = "") -> None:
        self.fail_on = fail_on
        self.batches: list[tuple[list[str], bool, str]] = []
        self.started = threading.Semaphore(0)
        self.release = threading.Event()
        if not hold:
            self.release.set()
        self.done = threading.Semaphore(0)

    def __call__(self, batch: list[str], idle: bool) -> None:
        self.batches.append((batch, idle, threading.current_thread().name))
        self.started.release()
        assert self.release.wait(5.0)
        self.done.release()
        if self.fail_on in batch:
            raise RuntimeError("a batch failed")

    def wait(self, batches: int) -> None:
        for _ in range(batches):
            assert self.done.acquire(timeout=5.0)


@contextlib.contextmanager
def running(run: Callable[[list[Any], bool], None], workers: int, max_batch: int, max_wait_s: float = 0.0,
            name: str = "batch") -> Iterator[BatchThreads[Any]]:
    """Batch threads for one test, closed and joined at its end."""
    threads: BatchThreads[Any] = BatchThreads(run, workers=workers, max_batch=max_batch, max_wait_s=max_wait_s,
                                              name=name)
    try:
        yield threads
    finally:
        threads.close()
        threads.join(5.0)


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_each_thread_takes_work_and_no_more_run_at_once(workers: int) -> None:
    lock, busy, most = threading.Lock(), [0], [0]
    all_busy = threading.Event()

    def run(batch: list[int], idle: bool) -> None:
        with lock:
            busy[0] += 1
            most[0] = max(most[0], busy[0])
            if busy[0] == workers:
                all_busy.set()
        assert all_busy.wait(5.0)  # every thread takes a batch before any ends
        with lock:
            busy[0] -= 1
        done.release()

    done = threading.Semaphore(0)
    with running(run, workers=workers, max_batch=1) as threads:
        for k in range(6):
            threads.put(k)
        for _ in range(6):
            assert done.acquire(timeout=5.0)
        assert most[0] == workers


def test_a_lone_item_is_taken_by_an_idle_thread_and_named_idle() -> None:
    run = Recorder()
    with running(run, workers=2, max_batch=8, name="scorer") as threads:
        threads.put("a")
        run.wait(1)
        assert [(b, idle) for b, idle, _ in run.batches] == [(["a"], True)]
        assert run.batches[0][2].startswith("scorer-")


def test_items_queued_behind_a_busy_thread_form_the_next_batch() -> None:
    run = Recorder(hold=True)
    with running(run, workers=1, max_batch=3) as threads:
        threads.put("first")
        assert run.started.acquire(timeout=5.0)  # the only thread is busy with "first"
        for k in range(5):
            threads.put(f"q{k}")
        run.release.set()
        run.wait(3)
        assert [(b, idle) for b, idle, _ in run.batches] == [
            (["first"], True), (["q0", "q1", "q2"], False), (["q3", "q4"], False)]  # waited: not idle


def test_a_window_waits_for_more_items() -> None:
    run = Recorder()
    with running(run, workers=1, max_batch=8, max_wait_s=0.3) as threads:
        began = time.monotonic()
        threads.put("a")
        threads.put("b")
        run.wait(1)
        # a batch short of `max_batch` runs once the window is out, never before (a slow host only makes it later)
        assert run.batches[0][0] == ["a", "b"] and time.monotonic() - began >= 0.3


def test_a_batch_that_raises_leaves_the_thread_running() -> None:
    run = Recorder(fail_on="bad")
    with running(run, workers=1, max_batch=1) as threads:
        threads.put("bad")
        run.wait(1)
        threads.put("good")
        run.wait(1)
        assert [b for b, _, _ in run.batches] == [["bad"], ["good"]]


def test_close_stops_the_threads_and_gives_back_what_was_never_taken() -> None:
    run = Recorder(hold=True)
    threads = BatchThreads(run, workers=1, max_batch=1)
    threads.put("in flight")
    assert run.started.acquire(timeout=5.0)
    threads.put("queued")
    assert threads.close() == ["queued"]
    assert threads.close() == []  # idempotent
    run.release.set()
    threads.join(5.0)
    assert [b for b, _, _ in run.batches] == [["in flight"]]
    assert not any(t.name.startswith("batch-") and t.is_alive() for t in threading.enumerate())
    with pytest.raises(RuntimeError, match="closed"):
        threads.put("late")


def test_the_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="workers"):
        BatchThreads(Recorder(), workers=0, max_batch=1)
