"""The shared degradation ladder on the real Redis: two monitors (as two processes would have) decide one
state; the leader merges both processes' own signals; a new leader keeps the entry times (hysteresis)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from gateway.control.adaptation.degradation import DegradationMonitor
from gateway.control.adaptation.ladder_sync import LadderSync, Report, merge_reports
from policies.ladder_schema import LadderStep
from policies.loader import LoadedPolicy
from tests.conftest import SHARED_URL

pytestmark = pytest.mark.redis


def _loaded(hold_s: float) -> LoadedPolicy:
    step = LadderStep.model_validate({
        "name": "errors-high", "signal": "error_rate", "pool": "flagship", "enter_above": 0.5, "exit_below": 0.2,
        "hold_s": hold_s, "action": {"type": "fallback_pool", "to_pool": "micro"},
    })

    class _Degradation:
        steps = (step,)

    class _Policy:
        degradation = _Degradation()

    class _Loaded:
        version = f"v-{hold_s}"
        policy = _Policy()

    return _Loaded()  # type: ignore[return-value]


@pytest.fixture
async def client() -> AsyncIterator[aioredis.Redis]:
    redis = aioredis.from_url(SHARED_URL)
    yield redis
    await redis.aclose()


def _monitor(client: aioredis.Redis, prefix: str, hold_s: float, lease_s: float = 3.0) -> DegradationMonitor:
    monitor = DegradationMonitor(dict)
    monitor.use_policy(_loaded(hold_s))
    monitor.share(LadderSync(client, prefix, lease_s=lease_s))
    return monitor


def test_merge_reports_pools_samples_and_counts() -> None:
    merged = merge_reports([Report({"f": [0.1] * 19}, {"f": (1, 10)}), Report({"f": [2.0]}, {"f": (9, 10)})])
    assert merged[("error_rate", "f")] == 0.5
    assert merged[("ttft_p95_s", "f")] == 0.1  # 20 samples: the 19th smallest
    assert merge_reports([Report({"f": [0.1] * 18 + [2.0, 2.0]}, {})])[("ttft_p95_s", "f")] == 2.0


def test_merge_reports_adds_up_in_flight_over_the_processes() -> None:
    merged = merge_reports([Report({}, {}, {"f": 3, "m": 1}), Report({}, {}, {"f": 4}), Report({}, {})])
    assert merged[("in_flight", "f")] == 7.0 and merged[("in_flight", "m")] == 1.0


async def test_reports_of_an_older_worker_without_in_flight_still_count(client: aioredis.Redis, prefix: str) -> None:
    sync = LadderSync(client, prefix)
    await client.hset(f"{prefix}ladder:{{sync}}:reports", "old-worker",
                      b'{"at": 9e12, "ttft": {}, "outcomes": {"f": [1, 2]}}')
    await sync.publish(Report({}, {"f": (0, 2)}, {"f": 2}))
    merged = merge_reports(await sync.reports())
    assert merged[("in_flight", "f")] == 2.0 and merged[("error_rate", "f")] == 0.25


async def test_one_leader_decides_on_both_processes_signals_and_the_follower_adopts(
        client: aioredis.Redis, prefix: str) -> None:
    a, b = _monitor(client, prefix, hold_s=0), _monitor(client, prefix, hold_s=0)
    await a.shared_tick()
    await b.shared_tick()
    assert a.leader and not b.leader
    # errors seen only by the follower (40%) and only by the leader (70%): together 55% > 50%
    for i in range(10):
        b.observe("flagship", error=i < 4)
        a.observe("flagship", error=i < 7)
    await b.shared_tick()  # publishes its report
    assert (await a.shared_tick()).names == ("errors-high",)
    assert (await b.shared_tick()).names == ("errors-high",)
    assert b.state.route("flagship") == ("micro", ("errors-high",))


async def test_hysteresis_survives_a_leader_change(client: aioredis.Redis, prefix: str) -> None:
    a, b = _monitor(client, prefix, hold_s=1.2, lease_s=0.3), _monitor(client, prefix, hold_s=1.2, lease_s=0.3)
    for _ in range(4):
        a.observe("flagship", error=True)
    await a.shared_tick()
    await b.shared_tick()
    assert a.leader and a.state.names == b.state.names == ("errors-high",)
    since_a = a.state.active[0].since
    await asyncio.sleep(0.4)  # a stops ticking (a dead process); its lease runs out, its report goes stale
    await client.hdel(f"{prefix}ladder:{{sync}}:reports", a._sync.me)  # type: ignore[union-attr]
    for _ in range(10):
        b.observe("flagship", error=False)
    state = await b.shared_tick()
    assert b.leader
    assert state.names == ("errors-high",)  # error rate 0 now, but the step is held for hold_s from its entry
    assert abs(state.active[0].since - since_a) < 0.1
    await asyncio.sleep(1.0)  # past hold_s from the entry
    assert (await b.shared_tick()).names == ()


async def test_a_follower_cannot_overwrite_the_state(client: aioredis.Redis, prefix: str) -> None:
    leader, other = LadderSync(client, prefix), LadderSync(client, prefix)
    assert await leader.hold_lease() == 2 and await other.hold_lease() == 0
    assert await leader.hold_lease() == 1
    assert not await other.write_state({"x": 1.0})
    assert await leader.write_state({"y": 2.0})
    assert await other.read_state() == {"y": 2.0}


async def test_a_shared_monitor_always_closes_mid_redis_command(client: aioredis.Redis, prefix: str) -> None:
    """Closed while its loop talks to Redis: redis-py 8.1 swallows such a cancellation now and then (about
    1 in 300), and a gateway then never finished shutting down. 200 closes, each one bounded."""
    for i in range(200):
        monitor = DegradationMonitor(dict, interval_s=0.0005)
        monitor.use_policy(_loaded(5.0))
        monitor.share(LadderSync(client, prefix))
        monitor.start()
        await asyncio.sleep(0.0005 * (i % 7 + 1))
        await asyncio.wait_for(monitor.aclose(), 5)
