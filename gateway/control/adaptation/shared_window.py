"""A window of recent entries shared by every worker through Redis, and the refresh loop that feeds it.

`ScoreWindow` is the window: a capped Redis list (`RedisWindow`: LPUSH + LTRIM + LRANGE, one pipelined round
trip) or a process-local one (`MemoryWindow`). `WindowSync` is what `LiveThreshold` and `LiveTradeoff` share:
a local buffer of entries noted per request, pushed to the window by a background task every `interval_s`, the
window read back; Redis down keeps the buffer (capped), logs the failure once and the recovery once, and the
caller keeps what it last computed.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Protocol

import redis.asyncio as aioredis

from backends.background import stop
from gateway.redis_client import REDIS_FAILURES
from policies.schema import Policy

__all__ = ["MemoryWindow", "RedisWindow", "ScoreWindow", "WindowSync", "window_key"]

log = logging.getLogger("cascade.threshold")


class ScoreWindow(Protocol):
    """The recent-scores window all workers share."""

    async def exchange(self, new: Sequence[str], keep: int) -> list[str]:
        """Add `new` entries, keep the latest `keep`, return those kept (newest first)."""
        ...


class MemoryWindow:
    """A window for one process (memory ledger, tests)."""

    def __init__(self) -> None:
        self._items: deque[str] = deque()

    async def exchange(self, new: Sequence[str], keep: int) -> list[str]:
        self._items.extendleft(new)
        while len(self._items) > keep:
            self._items.pop()
        return list(self._items)


def window_key(prefix: str) -> str:
    return f"{prefix}routing:recent-scores"


class RedisWindow:
    """A capped Redis list under `{prefix}routing:recent-scores` (or `key`). Uses, does not own, the client."""

    def __init__(self, client: aioredis.Redis, prefix: str, key: str | None = None) -> None:
        self._client, self._key = client, key or window_key(prefix)

    async def exchange(self, new: Sequence[str], keep: int) -> list[str]:
        async with self._client.pipeline(transaction=False) as pipe:
            if new:
                pipe.lpush(self._key, *new)
            pipe.ltrim(self._key, 0, keep - 1)
            pipe.lrange(self._key, 0, keep - 1)
            replies = await pipe.execute()
        return [v.decode() if isinstance(v, bytes) else str(v) for v in replies[-1]]


class WindowSync:
    """The buffer, the shared window and the refresh task of a live value; `aclose` stops the task.

    A subclass names its task (`TASK`), what it logs (`WHAT`: "score window", `KEEPS`: what stays while Redis is
    down) and implements `refresh`, calling `_exchange` to push the buffer and read the window back, and keeping
    what it read in `_entries` (newest first) for the value of the current policy (`_policy()`)."""

    TASK: ClassVar[str]
    WHAT: ClassVar[str]
    KEEPS: ClassVar[str]

    def __init__(self, window: ScoreWindow, policy: Callable[[], Policy], interval_s: float) -> None:
        self._window, self._policy, self._interval = window, policy, interval_s
        self._entries: list[str] = []  # the window as last read
        self._buffer: list[str] = []
        self._down = False
        self._task: asyncio.Task[None] | None = None

    async def refresh(self) -> None:
        raise NotImplementedError

    async def _exchange(self, keep: int, extra: dict[str, Any] | None = None) -> list[str] | None:
        """Push the buffer and return the window's latest `keep` entries; None when Redis failed (the buffer is
        kept, capped at `keep`; the failure logged once, with `extra`)."""
        pending, self._buffer = self._buffer, []
        try:
            entries = await self._window.exchange(pending, keep)
        except REDIS_FAILURES as exc:
            self._buffer = (pending + self._buffer)[-keep:]
            if not self._down:
                log.warning(f"shared {self.WHAT} unavailable; keeping the last {self.KEEPS}",
                            extra={**(extra or {}), "error": str(exc)})
            self._down = True
            return None
        if self._down:
            log.info(f"shared {self.WHAT} reachable again")
            self._down = False
        return entries

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self.TASK)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.refresh()
            except Exception:  # a bug here must not stop routing: keep the last value
                log.exception("%s refresh failed", self.KEEPS)

    async def aclose(self) -> None:
        await stop(self._task)
        self._task = None
