"""Drift is judged on every process's windows together (`gateway.serving.routing.drift_sync`): two processes (two
`DomainDrift`s, each with its `DriftSync`) on the real Redis under a test prefix, each seeing half of a tenant's
traffic, hold the same verdict; one that stops drops out; a Redis outage leaves each its own window."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from gateway.serving.routing.drift import DomainDrift
from gateway.serving.routing.drift_sync import DriftSync, merge_counts
from policies.learning import InDomain
from tests.conftest import SHARED_URL

pytestmark = pytest.mark.redis
SPEC = InDomain(bound=0.3, drift_share=0.4, window=100, min_requests=50)


@pytest.fixture
async def client() -> AsyncIterator[aioredis.Redis]:
    conn = aioredis.Redis.from_url(SHARED_URL)
    yield conn
    await conn.aclose()


def _traffic(drift: DomainDrift, requests: int, low_share: float) -> None:
    lows = round(requests * low_share)
    for i in range(requests):
        drift.observe(SPEC, "acme", 0.1 if i < lows else 0.9)


async def test_two_processes_judge_a_tenant_on_its_whole_traffic(client: aioredis.Redis, prefix: str) -> None:
    one, two = DomainDrift(), DomainDrift()
    syncs = [DriftSync(client, prefix, one), DriftSync(client, prefix, two)]
    _traffic(one, 30, 0.6)
    _traffic(two, 30, 0.6)
    assert not one.drifting("acme") and not two.drifting("acme")  # 30 each: under min_requests alone
    for sync in (*syncs, *syncs):  # each has read the other's report
        await sync.tick()
    assert one.drifting("acme") and two.drifting("acme")  # 60 together, 60% below the bound
    await syncs[1].aclose()  # a process that stops drops out at once
    await syncs[0].tick()
    assert not one.drifting("acme")
    await syncs[0].aclose()


async def test_an_unreachable_redis_leaves_each_process_its_own_window() -> None:
    dead = aioredis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    drift = DomainDrift()
    sync = DriftSync(dead, "test:drift:", drift)
    _traffic(drift, 40, 0.6)
    await sync.tick()
    assert not drift.shared and not drift.drifting("acme")
    _traffic(drift, 20, 0.6)  # its own window alone now reaches min_requests
    assert drift.drifting("acme")
    await dead.aclose()


def test_stale_and_unreadable_reports_are_left_out() -> None:
    reports = {"a": b'{"at": 100.0, "tenants": {"acme": [3, 10]}}', "b": b'{"at": 80.0, "tenants": {"acme": [5, 5]}}',
               "c": b"not json", "d": b'{"at": 99.0, "tenants": {"acme": [1, 2], "beta": [0, 4]}}'}
    assert merge_counts(reports, now=100.0, stale_s=10.0) == {"acme": (4, 12), "beta": (0, 4)}
