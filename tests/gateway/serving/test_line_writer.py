"""The line writer's hand-over (`gateway.serving.records.line_writer`): lines that arrive a millisecond apart, as a busy
event loop's access lines do, reach the file whole and in order in few writes, not one write (and one thread
wake-up) per line."""

from __future__ import annotations

import os
import time
from pathlib import Path

from gateway.serving.records.line_writer import LINGER_S, LineWriter


class _Counted(LineWriter):
    """A line writer that counts its writes."""

    writes = 0

    def _write(self, data: bytes, lines: int) -> None:
        self.writes += 1
        super()._write(data, lines)


def test_lines_a_millisecond_apart_are_written_whole_in_order_and_batched(tmp_path: Path) -> None:
    path = tmp_path / "lines.jsonl"
    writer = _Counted(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), True, "test lines")
    n = 300
    started = time.monotonic()
    for i in range(n):
        writer.put(b'{"i": %d}\n' % i)
        time.sleep(0.001)
    took = time.monotonic() - started
    writer.close()
    assert path.read_bytes().splitlines() == [b'{"i": %d}' % i for i in range(n)]
    # one write per linger period at most, plus one at close (a loaded machine only stretches the periods)
    assert writer.writes <= took / LINGER_S + 2 < n / 5, (writer.writes, took)


def test_a_line_put_to_an_idle_writer_is_written_without_close(tmp_path: Path) -> None:
    path = tmp_path / "lines.jsonl"
    writer = LineWriter(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), True, "test lines")
    time.sleep(0.05)  # the writer sleeps with nothing queued
    writer.put(b"one\n")
    deadline = time.monotonic() + 5
    while path.read_bytes() != b"one\n":
        assert time.monotonic() < deadline, "an idle writer was not woken by a line"
        time.sleep(0.01)
    writer.close()
