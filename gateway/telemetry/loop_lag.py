"""How late the event loop runs what is due: `cascade_event_loop_lag_seconds`.

A task asks to wake every `interval_s` and records how much later than asked it woke. Anything that holds the
loop (a full garbage collection over a large heap, a slow synchronous call) shows here as lag, and every request
in flight waits that long: it is the tail a client's p99 sees that no per-request timer measures.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from backends.background import stop

__all__ = ["LoopLag"]


class LoopLag:
    """Owns one task (`start` / `aclose`); `observe` receives each lag in seconds (a histogram's `observe`)."""

    def __init__(self, observe: Callable[[float], None], interval_s: float = 0.1) -> None:
        self._observe = observe
        self._interval = interval_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="loop-lag")

    async def _loop(self) -> None:
        while True:
            asked = time.monotonic()
            await asyncio.sleep(self._interval)
            self._observe(max(0.0, time.monotonic() - asked - self._interval))

    async def aclose(self) -> None:
        await stop(self._task)
        self._task = None
