"""The access log: one JSON line per request to an OpenAI endpoint (chat, responses, completions), never any prompt
or answer text.

A line holds `ts` (UTC, ISO 8601, when the request arrived), `request_id`, `tenant`, `key_id` (`gateway.api.auth.
key_id`: a digest prefix, never the key), `endpoint`, `status` (the HTTP status), `outcome` (an answered request's
ledger status: "ok", "client_disconnect", "upstream_error", "cache_hit"; else the error's code), `pool`,
`pool_version`, `rule`, `latency_ms`, `ttft_ms`, `prompt_tokens`, `completion_tokens` and `cost_micro_usd` (null
where the request got no answer).

Who writes it: the endpoint says when a request starts (`begin`) and writes the line of a request it refuses
(`refused`); an answered request's line is written when its final cost record is priced and recorded
(`answered`, called by `gateway.serving.records.accounting.Accountant`), so its tokens and cost are the ledger's.
Records of other ids (a cascade probe's, a shadow call's) write nothing.

Where: `target` "-" is stdout, any other string a file (created, appended), a pipe included.

Never on the event loop: a line is serialised and put on a bounded queue (`capacity` lines); a writer thread
writes it. A consumer that reads slowly or not at all (stdout piped into a reader that stalls) fills the pipe,
then the queue; from then on new lines are dropped and counted (`on_dropped("full", n)`:
`cascade_access_log_dropped_total{reason="full"}`), and no request waits for the log. A write that fails (`OSError`:
the reader closed its end, a full disk) drops its lines, counted with reason "error"; the first failure is logged
(and the first success after failures), nothing else changes. `close` flushes what is queued for at most
`flush_s`; lines still queued then are counted with reason "shutdown".

The writer joins queued lines into one `os.write` of at most PIPE_BUF (4 KiB), so the lines of several worker
processes sharing the file or stdout do not interleave (a line without text stays well under it); no fsync: an
access log is not a ledger. Sampling: a request is kept with probability `sample`, decided once when it begins.
`begin`, `answered` and `refused` are called from one event loop; `on_dropped` may be called from the writer
thread.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from gateway.ledger.store import CostRecord
from gateway.serving.records.line_writer import DroppedHook, LineWriter

__all__ = ["ANSWERED", "AccessLog"]

ANSWERED = frozenset({"ok", "client_disconnect", "upstream_error", "cache_hit"})  # a request's final record
_MAX_PENDING = 100_000  # requests begun and not yet logged; beyond it (a leak) the oldest are dropped


class AccessLog:
    """Writes access lines to `target` ("-": stdout; None: nowhere) through a `LineWriter` of `capacity` lines,
    which it owns with the file descriptor of a file target (`close`). `draw` gives the sampling draws (tests fix
    it); `on_dropped(reason, lines)` learns of lines dropped (see the module docstring)."""

    def __init__(self, target: str | None, sample: float = 1.0, draw: Callable[[], float] = random.random,
                 capacity: int = 10_000, on_dropped: DroppedHook | None = None) -> None:
        if not 0.0 <= sample <= 1.0:
            raise ValueError(f"access log sample must be in [0, 1], got {sample}")
        self._writer: LineWriter | None = None
        if target == "-":
            self._writer = LineWriter(1, False, "access log", capacity, on_dropped)
        elif target:
            path = Path(target)
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
            self._writer = LineWriter(fd, True, "access log", capacity, on_dropped)
        self._sample = sample
        self._draw = draw
        self._pending: dict[str, tuple[str, str, float]] = {}  # request id -> (key id, endpoint, arrival UTC s)

    @property
    def enabled(self) -> bool:
        return self._writer is not None

    def begin(self, request_id: str, key_id: str, endpoint: str) -> None:
        """A request arrived; its line is written by `answered` or `refused` if it is sampled."""
        if self._writer is None or (self._sample < 1.0 and self._draw() >= self._sample):
            return
        if len(self._pending) >= _MAX_PENDING:
            del self._pending[next(iter(self._pending))]
        self._pending[request_id] = (key_id, endpoint, time.time())

    def answered(self, rec: CostRecord) -> None:
        """The final cost record of a begun request: its line (status 200)."""
        if rec.status not in ANSWERED or (begun := self._pending.pop(rec.request_id, None)) is None:
            return
        self._write({"ts": _iso(rec.started_at), "request_id": rec.request_id, "tenant": rec.tenant,
                     "key_id": begun[0], "endpoint": rec.endpoint, "status": 200, "outcome": rec.status,
                     "pool": rec.pool, "pool_version": rec.pool_version or None, "rule": rec.rule,
                     "latency_ms": rec.latency_ms, "ttft_ms": rec.ttft_ms, "prompt_tokens": rec.prompt_tokens,
                     "completion_tokens": rec.completion_tokens, "cost_micro_usd": rec.cost_micro_usd})

    def refused(self, request_id: str, tenant: str, status: int, outcome: str, started: float) -> None:
        """A begun request answered with an error (`outcome`: its code) or dropped; `started`: monotonic s."""
        if (begun := self._pending.pop(request_id, None)) is None:
            return
        key, endpoint, arrived = begun
        self._write({"ts": _iso(arrived), "request_id": request_id, "tenant": tenant, "key_id": key,
                     "endpoint": endpoint, "status": status, "outcome": outcome, "pool": None, "pool_version": None,
                     "rule": None, "latency_ms": round((time.monotonic() - started) * 1000, 3), "ttft_ms": None,
                     "prompt_tokens": None, "completion_tokens": None, "cost_micro_usd": None})

    def _write(self, line: dict[str, Any]) -> None:
        if self._writer is not None:
            self._writer.put(orjson.dumps(line) + b"\n")

    def close(self, flush_s: float = 2.0) -> None:
        """Write the queued lines (for at most `flush_s`) and stop writing. Blocks: call it off the event loop."""
        if self._writer is not None:
            self._writer.close(flush_s)
        self._writer = None


def _iso(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
