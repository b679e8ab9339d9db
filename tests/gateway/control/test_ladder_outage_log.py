"""While the shared ladder's Redis is down the monitor decides locally on every tick but says so at most once per
`warn_interval_s` (with the ticks since the last line), and once when Redis answers again. A real redis-server of
the test's own, killed and started again under the monitor's running loop."""

from __future__ import annotations

import asyncio
import logging
import re

import pytest
import redis.asyncio as aioredis

from backends.clients.pool import Pool
from gateway.control.adaptation.degradation import DegradationMonitor
from gateway.control.adaptation.ladder_sync import LadderSync
from policies.ladder import LadderState
from tests.servers import PrivateRedis, until_async

pytestmark = pytest.mark.redis


def _lines(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "cascade.degradation" and text in r.getMessage()]


async def test_shared_ladder_outage_is_logged_once_per_interval(private_redis: PrivateRedis,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="cascade.degradation")
    client = aioredis.from_url(private_redis.url, socket_timeout=0.2, socket_connect_timeout=0.2)
    clock = [0.0]
    pools: dict[str, Pool] = {}
    monitor = DegradationMonitor(lambda: pools, interval_s=0.02, warn_interval_s=30.0, monotonic=lambda: clock[0])
    monitor.share(LadderSync(client, "test:"))
    ticks = 0
    tick = monitor.tick

    def counted_tick(now: float | None = None) -> LadderState:
        nonlocal ticks
        ticks += 1
        return tick(now)

    monitor.tick = counted_tick  # type: ignore[method-assign]  # the local ticks taken while Redis is down
    monitor.start()
    try:
        await until_async(lambda: monitor.leader)  # shared ticks work
        private_redis.kill()
        await until_async(lambda: ticks >= 20)
        unavailable = _lines(caplog, "shared ladder unavailable")
        assert len(unavailable) == 1, [r.getMessage() for r in unavailable]
        assert "1 tick(s) since the last line" in unavailable[0].getMessage()
        clock[0] = 31.0  # past the interval: the next failing tick logs, with the ticks held back
        await until_async(lambda: len(_lines(caplog, "shared ladder unavailable")) == 2)
        held = re.search(r"(\d+) tick\(s\) since", _lines(caplog, "shared ladder unavailable")[1].getMessage())
        assert held is not None and int(held.group(1)) >= 20
        assert _lines(caplog, "available again") == []
        private_redis.start()
        await until_async(lambda: len(_lines(caplog, "available again")) == 1)
        await asyncio.sleep(0.2)  # more shared ticks: no second line
        assert len(_lines(caplog, "available again")) == 1
        assert len(_lines(caplog, "shared ladder unavailable")) == 2
    finally:
        await monitor.aclose()
        await client.aclose()
