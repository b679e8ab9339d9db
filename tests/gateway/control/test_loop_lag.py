"""The event-loop lag monitor sees a loop held by a blocking call, and next to nothing on an idle one."""

from __future__ import annotations

import asyncio
import time

from gateway.telemetry.loop_lag import LoopLag


async def test_a_held_loop_shows_as_lag() -> None:
    lags: list[float] = []
    monitor = LoopLag(lags.append, interval_s=0.02)
    monitor.start()
    await asyncio.sleep(0.2)
    idle = list(lags)
    time.sleep(0.3)  # what a long garbage collection does to every request in flight
    await asyncio.sleep(0.1)
    await monitor.aclose()
    assert idle and sorted(idle)[len(idle) // 2] < 0.1  # the median of an idle loop: on time
    assert max(lags) >= 0.25
