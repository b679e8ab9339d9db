"""The batch lane: a line is let through only while its pool has headroom (the engines' queue and KV use, this
gateway's interactive requests, the lane's own lines), waits while it has none, and gives up (`LaneBusy`) after the
policy's `max_wait_s`; interactive load that rises takes the pool back within one poll."""

from __future__ import annotations

import asyncio

import pytest

from backends.clients.pool import Pool
from gateway.batches.lane import BatchLane, LaneBusy, LinePreempted
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


async def _line(lane: BatchLane, loaded: LoadedPolicy, pool: str, request_id: str, ran: list[str]) -> str:
    """A line's call: it enters the lane, then runs on its engine until cancelled (what `ran` records)."""
    await lane.enter(loaded, pool, request_id)
    try:
        await asyncio.sleep(10)
    except asyncio.CancelledError:
        ran.append(f"{request_id} cancelled")
        raise
    return "answered"


async def test_an_interactive_request_past_the_bounds_preempts_the_lines_running_on_its_pool() -> None:
    micro, other = _pool(), Pool("other", ["http://other.engine.test"], FakeEngines().client())
    preempted: list[str] = []
    lane = BatchLane(lambda: {"micro": micro, "other": other}, poll_s=0.01, on_preempt=preempted.append)
    loaded, ran = _policy("{max_interactive: 0, preempt: true}"), list[str]()
    lines = [asyncio.create_task(lane.preemptible(rid, _line(lane, loaded, pool, rid, ran)))
             for rid, pool in (("a", "micro"), ("b", "micro"), ("c", "other"))]
    await asyncio.sleep(0.05)
    assert lane.in_flight("micro") == 2 and lane.in_flight("other") == 1
    await lane.arrived(loaded, "micro")
    for line in lines[:2]:
        with pytest.raises(LinePreempted) as caught:
            await asyncio.wait_for(line, 1)
        assert caught.value.status == 503 and caught.value.code == "batch_line_preempted"
    assert sorted(ran) == ["a cancelled", "b cancelled"] and preempted == ["micro", "micro"]
    assert not lines[2].done()  # another pool's line runs on
    lines[2].cancel()
    with pytest.raises(asyncio.CancelledError):  # a line's task cancelled (its worker stopping): so is its call
        await lines[2]
    assert ran[-1] == "c cancelled" and preempted == ["micro", "micro"]


@pytest.mark.parametrize("batches", ["{max_interactive: 0}", "{max_interactive: 1, preempt: true}",
                                     "{preempt: true}"])
async def test_no_line_is_preempted_without_preempt_or_while_the_pool_keeps_its_headroom(batches: str) -> None:
    pool = _pool()
    lane = BatchLane(lambda: {"micro": pool}, poll_s=0.01)
    loaded, ran = _policy(batches), list[str]()
    line = asyncio.create_task(lane.preemptible("a", _line(lane, loaded, "micro", "a", ran)))
    await asyncio.sleep(0.05)
    pool.replicas[0].in_flight = 1  # the line itself, on the engine
    await lane.arrived(loaded, "micro")  # one interactive request: within max_interactive 1, and no bound by default
    await asyncio.sleep(0.05)
    assert not line.done() and ran == []
    line.cancel()


async def test_a_line_that_ended_before_its_preemption_keeps_its_answer() -> None:
    pool = _pool()
    lane = BatchLane(lambda: {"micro": pool}, poll_s=0.01)
    loaded, arriving = _policy("{max_interactive: 0, preempt: true}"), list[asyncio.Task[None]]()

    async def answered() -> str:
        await lane.enter(loaded, "micro", "a")
        # an interactive request comes as the answer does: after the call ended, before its line heard of it
        come = lane.arrived(loaded, "micro")
        asyncio.get_running_loop().call_soon(lambda: arriving.append(asyncio.create_task(come)))
        return "answered"

    assert await lane.preemptible("a", answered()) == "answered"
    await arriving[0]


async def test_a_line_waits_a_poll_after_an_interactive_request_was_routed_to_its_pool() -> None:
    pool, now = _pool(), [100.0]
    lane = BatchLane(lambda: {"micro": pool}, poll_s=0.05, monotonic=lambda: now[0])
    bounds = _policy("{max_interactive: 0}").policy.batches
    await lane.arrived(_policy("{max_interactive: 0}"), "micro")  # routed: not yet counted by the engine client
    assert not lane.headroom(bounds, "micro")
    now[0] += 0.06
    assert lane.headroom(bounds, "micro")
