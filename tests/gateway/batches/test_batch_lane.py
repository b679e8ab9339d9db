"""The batch lane: a line is let through only while its pool has headroom (the engines' queue and KV use, this
gateway's interactive requests, the lane's own lines), waits while it has none, and gives up (`LaneBusy`) after the
policy's `max_wait_s`; interactive load that rises takes the pool back within one poll."""

from __future__ import annotations

import asyncio

import pytest

from backends.clients.pool import Pool
from gateway.batches.lane import BatchLane, LaneBusy
from policies.loader import LoadedPolicy, parse_policy
from tests.conftest import policy_yaml
from tests.harness import FakeEngines


def _policy(batches: str) -> LoadedPolicy:
    return parse_policy(policy_yaml("http://micro.engine.test", "http://flagship.engine.test", f"batches: {batches}\n"))


def _pool() -> Pool:
    return Pool("micro", ["http://micro.engine.test"], FakeEngines().client())


async def test_a_line_waits_while_the_engines_queue_and_is_let_through_once_it_drains() -> None:
    pool = _pool()
    lane = BatchLane(lambda: {"micro": pool}, poll_s=0.01)
    loaded = _policy("{max_queue: 0, max_kv: 0.8, max_wait_s: 2}")
    pool.replicas[0].load.waiting = 3  # interactive requests queue on the engine
    entering = asyncio.create_task(lane.enter(loaded, "micro", "req-1"))
    await asyncio.sleep(0.1)
    assert not entering.done() and lane.waiting == 1 and lane.in_flight("micro") == 0
    pool.replicas[0].load.waiting = 0
    await asyncio.wait_for(entering, 1)
    assert lane.in_flight("micro") == 1 and lane.active()
    pool.replicas[0].load.kv_cache_usage = 0.95  # full KV cache: no more lines
    assert not lane.headroom(loaded.policy.batches, "micro")
    lane.leave("req-1")
    lane.leave("req-1")  # idempotent
    assert lane.in_flight("micro") == 0


async def test_a_line_gives_up_after_max_wait_and_the_lane_bounds_its_own_lines() -> None:
    pool = _pool()
    changes: list[tuple[str, int]] = []
    lane = BatchLane(lambda: {"micro": pool}, lambda p, n: changes.append((p, n)), poll_s=0.01)
    loaded = _policy("{lines_in_flight: 2, max_interactive: 1, max_wait_s: 0.1}")
    await lane.enter(loaded, "micro", "a")
    await lane.enter(loaded, "micro", "b")
    with pytest.raises(LaneBusy) as refused:  # two lines of this process on the pool: the bound
        await lane.enter(loaded, "micro", "c")
    assert refused.value.status == 503 and refused.value.code == "batch_lane_busy"
    lane.leave("a")
    pool.replicas[0].in_flight = 1 + 2  # two interactive requests (and this lane's one line)
    with pytest.raises(LaneBusy):
        await lane.enter(loaded, "micro", "c")
    pool.replicas[0].in_flight = 1 + 1
    await lane.enter(loaded, "micro", "c")
    assert changes == [("micro", 1), ("micro", 2), ("micro", 1), ("micro", 2)]


async def test_a_pool_the_lane_does_not_know_has_headroom() -> None:
    lane = BatchLane(dict, poll_s=0.01)
    await lane.enter(_policy("{}"), "elsewhere", "x")
    assert lane.in_flight("elsewhere") == 1


async def test_a_pool_whose_load_is_stale_has_no_headroom_until_scraped_again() -> None:
    pool, now = _pool(), [100.0]
    lane = BatchLane(lambda: {"micro": pool}, poll_s=0.01, fresh_s=5.0, monotonic=lambda: now[0])
    bounds = _policy("{}").policy.batches
    assert lane.headroom(bounds, "micro")  # never scraped (a remote pool without /metrics): its own figures only
    pool.replicas[0].load.at = 90.0  # scraped 10 s ago: an idle pool's load, scraped seldom
    assert not lane.headroom(bounds, "micro")
    pool.replicas[0].load.at = 99.0
    assert lane.headroom(bounds, "micro")
