"""Local append-only outbox: ledger records that could not reach Redis, as JSON lines, fsynced.

Files in the outbox directory (one gateway process per directory, enforced with an `flock`):

- `ledger-outbox.jsonl`: new lines are appended here. `append` returns only after `write` + `fsync`
  (and, when the file was just created, an fsync of the directory), so an acknowledged line survives a
  process or machine crash.
- `ledger-outbox.draining.jsonl`: a batch claimed for replay. `claim` renames the outbox to this name
  (atomic; new appends then start a fresh outbox) and the consumer calls `release` (unlink) only after
  every line in it was applied. A crash mid-replay leaves the file, and the next `claim` returns it
  again: replay must therefore be idempotent (the ledger's script is).
- `ledger-outbox.rejected.jsonl`: lines that could not be decoded (or that the consumer refused),
  kept for a human, never dropped.

Concurrent `append` calls are group-committed: one write and one fsync per batch, in a worker thread, so
the event loop never blocks on the disk. A torn tail (a crash mid-write, never acknowledged) is cut off
when the outbox is opened.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

import orjson

__all__ = ["Outbox", "OutboxBusy"]

_log = logging.getLogger(__name__)
T = TypeVar("T")
_OUTBOX = "ledger-outbox.jsonl"
_DRAINING = "ledger-outbox.draining.jsonl"
_REJECTED = "ledger-outbox.rejected.jsonl"
_LOCK = "ledger-outbox.lock"


class OutboxBusy(RuntimeError):
    """Another process holds this outbox directory."""


class Outbox:
    """Durable queue of flat JSON objects (`dict[str, str]`, one per line) in `directory`.

    Lifecycle: `await open()` (creates the directory, takes the lock, repairs a torn tail), then any
    number of `append` / `claim` / `release`, then `await aclose()` (waits for in-flight appends and
    releases the lock). The outbox owns its files and lock; it never deletes a line it has not been told
    (via `release`) was applied.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._outbox = directory / _OUTBOX
        self._draining = directory / _DRAINING
        self._rejected = directory / _REJECTED
        self._lock_fd: int | None = None
        self._pending: list[tuple[bytes, asyncio.Future[None]]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._io = asyncio.Lock()  # serialises flushes, claim's rename and release
        self._has_lines = False
        self.rejected = 0  # malformed lines moved to the rejected file since open
        self.waiting = 0  # lines on disk not yet released (left at open, appended since, or claimed)
        self._claimed = 0  # lines of the batch `claim` returned last (released together)

    @property
    def has_lines(self) -> bool:
        """Whether lines may be waiting for replay (known without touching the disk)."""
        return self._has_lines or bool(self._pending)

    async def open(self) -> None:
        """Create the directory, take the process lock (raises `OutboxBusy`), cut a torn tail."""
        self._lock_fd = await asyncio.to_thread(self._open_sync)
        self.waiting = await asyncio.to_thread(self._count_lines_sync)
        self._has_lines = self.waiting > 0

    async def append(self, obj: Mapping[str, str]) -> None:
        """Append one object durably; returns after it is fsynced. Raises `OSError` if the disk fails."""
        if self._lock_fd is None:
            raise RuntimeError("Outbox.open() was not called")
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((orjson.dumps(obj) + b"\n", fut))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_pending())
        # shield: a cancelled caller must not cancel the write that other callers share
        await asyncio.shield(fut)

    async def claim(self, decode: Callable[[dict[str, str]], T]) -> list[T] | None:
        """Return the decoded batch to replay (a left-over draining file first), or None if empty.

        The batch stays on disk until `release`; calling `claim` again before that returns it again.
        Lines that are not flat JSON objects of strings, or that `decode` refuses with `ValueError`,
        go to the rejected file (counted in `rejected`) and are left out.
        """
        async with self._io:
            lines = await asyncio.to_thread(self._claim_sync)
            if lines is None:
                self._has_lines = bool(self._pending)
                self.waiting = self._claimed = 0
                return None
            self._claimed = len(lines)
        objects, bad = _decode(lines, decode)
        if bad:
            self.rejected += len(bad)
            _log.error("ledger outbox: %d malformed lines moved to %s", len(bad), self._rejected)
            await self._reject(bad)
        return objects

    async def release(self) -> None:
        """Forget the claimed batch: every line in it has been applied."""
        async with self._io:
            await asyncio.to_thread(self._release_sync)
            self.waiting = max(0, self.waiting - self._claimed)
            self._claimed = 0

    async def _reject(self, lines: list[bytes]) -> None:
        async with self._io:
            await asyncio.to_thread(_append_fsync, self._rejected, b"".join(lines))

    async def aclose(self) -> None:
        """Wait for in-flight appends, then release the directory lock. Idempotent."""
        if self._flusher is not None:
            with contextlib.suppress(Exception):
                await self._flusher
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor drops the flock
            self._lock_fd = None

    async def _flush_pending(self) -> None:
        async with self._io:
            while self._pending:
                batch, self._pending = self._pending, []
                try:
                    await asyncio.to_thread(_append_fsync, self._outbox, b"".join(x for x, _ in batch))
                except OSError as exc:
                    _settle(batch, exc)
                    continue
                self._has_lines = True
                self.waiting += len(batch)
                _settle(batch, None)

    def _open_sync(self) -> int:
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.directory / _LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(fd)
            raise OutboxBusy(f"outbox directory {self.directory} is in use by another process") from exc
        for path in (self._outbox, self._draining):
            _cut_torn_tail(path)
        return fd

    def _count_lines_sync(self) -> int:
        return sum(p.read_bytes().count(b"\n") for p in (self._outbox, self._draining) if p.exists())

    def _claim_sync(self) -> list[bytes] | None:
        if not self._draining.exists():
            if not self._outbox.exists() or self._outbox.stat().st_size == 0:
                return None
            os.replace(self._outbox, self._draining)
            _fsync_dir(self.directory)
        lines = [x + b"\n" for x in self._draining.read_bytes().split(b"\n") if x.strip()]
        if not lines:
            self._release_sync()
            return None
        return lines

    def _release_sync(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._draining.unlink()
        _fsync_dir(self.directory)


def _decode(lines: list[bytes], decode: Callable[[dict[str, str]], T]) -> tuple[list[T], list[bytes]]:
    objects: list[T] = []
    bad: list[bytes] = []
    for line in lines:
        try:
            obj = orjson.loads(line)
            if not isinstance(obj, dict) or not all(isinstance(v, str) for v in obj.values()):
                raise ValueError("not a flat JSON object of strings")
            objects.append(decode(obj))
        except ValueError:  # orjson.JSONDecodeError is a ValueError
            bad.append(line)
    return objects, bad


def _settle(batch: list[tuple[bytes, asyncio.Future[None]]], exc: BaseException | None) -> None:
    for _, fut in batch:
        if fut.done():
            continue
        if exc is None:
            fut.set_result(None)
        else:
            fut.set_exception(exc)


def _append_fsync(path: Path, data: bytes) -> None:
    """Append `data` and fsync. On failure the file is cut back to its old size (no torn line)."""
    created = not path.exists()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        size = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)
    if created:
        _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _cut_torn_tail(path: Path) -> None:
    """Drop bytes after the last newline: a write that crashed before its fsync was never acknowledged."""
    if not path.exists():
        return
    with open(path, "r+b") as fh:
        end = fh.seek(0, os.SEEK_END)
        pos = end
        while pos > 0:
            start = max(0, pos - 65536)
            fh.seek(start)
            newline = fh.read(pos - start).rfind(b"\n")
            if newline >= 0:
                pos = start + newline + 1
                break
            pos = start
        if pos != end:
            fh.truncate(pos)
            os.fsync(fh.fileno())
