"""The outbox backlog (`cascade_ledger_outbox_records`): the records waiting on disk while Redis is down, counted
when they are written, when a process starts on an outbox left behind, and back to 0 once replayed. A real
redis-server, started and stopped by the test."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.ledger.store import RedisLedger
from gateway.telemetry.metrics import GatewayMetrics
from tests.gateway.ledger.test_ledger import make_record
from tests.servers import PrivateRedis

pytestmark = pytest.mark.redis


def _backlog(metrics: GatewayMetrics) -> str:
    return next(line for line in metrics.render().decode().splitlines()
                if line.startswith("cascade_ledger_outbox_records "))


async def test_the_outbox_backlog_rises_while_redis_is_down_and_falls_when_replayed(
        tmp_path: Path, stopped_redis: PrivateRedis) -> None:
    metrics = GatewayMetrics(dict)
    first = RedisLedger(stopped_redis.url, tmp_path / "outbox", "t:", op_timeout_s=0.2, drain_interval_s=3600)
    metrics.outbox_records = first.outbox_records
    await first.start()
    for i in range(3):
        await first.record(make_record(i))
    assert (first.counts.spilled, first.outbox_records()) == (3, 3)
    assert _backlog(metrics) == "cascade_ledger_outbox_records 3.0"
    await first.aclose()

    second = RedisLedger(stopped_redis.url, tmp_path / "outbox", "t:", op_timeout_s=0.2, drain_interval_s=3600)
    await second.start()  # Redis still down: the 3 left on disk are waiting
    await second.record(make_record(3))
    assert second.outbox_records() == 4
    stopped_redis.start()
    assert await second.drain()
    assert (second.counts.replayed, second.outbox_records()) == (4, 0)
    await second.aclose()
