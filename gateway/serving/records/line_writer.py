"""Lines written to a file descriptor by a thread of their own, through a bounded queue, so that a reader that
stalls (a pipe nobody reads, a slow disk) never holds the event loop that produces them.

Contract: `put` never blocks and never raises for the descriptor's sake. A line that finds the queue full is
dropped and reported as `on_dropped("full", 1)`. `put` is one `deque.append`: it wakes the writer only when the
writer sleeps with nothing queued, and a woken writer lets lines gather for `LINGER_S` before it writes, so a busy
event loop hands over a batch of lines per wake-up, not a lock, a notify and a thread switch per line (that was
2.5% of the gateway's samples at 640 requests/s). A line waits at most about `LINGER_S` before it is written.
The writer thread joins queued lines into writes of at most
`PIPE_BUF` bytes (a write that size to a pipe is atomic, and each `O_APPEND` write to a file lands whole, so
lines of several processes sharing one descriptor never interleave); a write that fails (`OSError`) drops the
lines it held (`on_dropped("error", n)`) and the next lines are tried again: the first failure is logged, and
the first success after failures. `close` waits at most `flush_s` for the queue to empty; lines still queued
then are reported as `on_dropped("shutdown", n)`, never written, and the thread, blocked on a reader that never
reads, ends if that write ever returns (a daemon: it does not hold the process's exit). `on_dropped` is called
from the thread that drops.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections import deque
from collections.abc import Callable

__all__ = ["LINGER_S", "DroppedHook", "LineWriter"]

log = logging.getLogger("cascade.logs")

DroppedHook = Callable[[str, int], None]
"""``(reason, lines)``: lines dropped, reason ``"full"``, ``"error"`` or ``"shutdown"``."""

LINGER_S = 0.02
"""How long a woken writer lets lines gather before it writes them."""


class LineWriter:
    """Writes lines to `fd` from a daemon thread. Owns the thread, and the descriptor when `owned` (closed by
    `close` once the thread has ended)."""

    def __init__(self, fd: int, owned: bool, name: str, capacity: int = 10_000,
                 on_dropped: DroppedHook | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"{name}: the queue must hold at least one line, got {capacity}")
        self._fd, self._owned, self._name = fd, owned, name
        self._lines: deque[bytes] = deque()  # appended by `put` (any thread), taken by the writer thread alone
        self._capacity = capacity
        self._wake = threading.Event()  # set by `put` while the writer sleeps with nothing queued, and by `close`
        self._asleep = False
        self.on_dropped = on_dropped
        self._failing = 0  # lines lost to write errors since the last write that succeeded
        self._closed = False
        self._abandoned = False  # `close` gave up on the reader: what is still queued is counted, never written
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, line: bytes) -> None:
        """Queue one line (ending with a newline); dropped and counted when the queue is full or closed."""
        if self._closed:
            self._dropped("shutdown", 1)
            return
        if len(self._lines) >= self._capacity:
            self._dropped("full", 1)
            return
        self._lines.append(line)
        if self._asleep:  # read after the append: a writer that went to sleep before it saw the line is woken
            self._asleep = False  # once: the lines that arrive before the woken writer runs do not set it again
            self._wake.set()

    def _run(self) -> None:
        while not self._abandoned:
            if not self._lines:
                if self._closed:
                    return
                self._asleep = True  # set before the check below: `put` then sees it and wakes the writer
                if not self._lines and not self._closed:
                    self._wake.wait()
                self._asleep = False
                self._wake.clear()
                if not self._closed:
                    time.sleep(LINGER_S)  # let the lines of a busy moment gather into few writes
            self._write_some()

    def _write_some(self) -> None:
        """Write the queued lines, joined into writes of at most `PIPE_BUF` bytes (one line longer than that is
        one write of its own)."""
        while self._lines and not self._abandoned:
            batch = [self._lines.popleft()]
            size = len(batch[0])
            while self._lines and size + len(self._lines[0]) <= select.PIPE_BUF:
                line = self._lines.popleft()
                batch.append(line)
                size += len(line)
            self._write(b"".join(batch), len(batch))

    def _write(self, data: bytes, lines: int) -> None:
        try:
            while data:
                data = data[os.write(self._fd, data):]
        except OSError as exc:
            if not self._failing:
                log.error("%s: writing failed (%s); its lines are dropped and counted until a write succeeds",
                          self._name, exc)
            self._failing += lines
            self._dropped("error", lines)
            return
        if self._failing:
            log.warning("%s: writing works again; %d line(s) were lost", self._name, self._failing)
            self._failing = 0

    def _dropped(self, reason: str, lines: int) -> None:
        if self.on_dropped is not None:
            self.on_dropped(reason, lines)

    def close(self, flush_s: float = 2.0) -> None:
        """Write what is queued (for at most `flush_s`), then stop the thread and close an owned descriptor.
        Blocks the calling thread: call it from a worker thread, not the event loop. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        self._thread.join(flush_s)
        if self._thread.is_alive():
            self._abandoned = True  # the thread ends after the write it is blocked in, if that ever returns
            left = len(self._lines)
            log.warning("%s: %d line(s) not written at shutdown: the reader stopped reading", self._name, left)
            self._dropped("shutdown", left)
            return  # the thread may still be writing to the descriptor: it is not closed under it
        if self._owned:
            os.close(self._fd)
