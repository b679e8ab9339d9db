"""Scale to zero under `--workers N`, fast: the parent's `SharedOnDemand` against fake pools and the workers'
figures as plain values, and a worker's `WorkerEngines` against a real registry folder and gauge file."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from backends.engines.registry import publish
from gateway.control.fleet.on_demand import OnDemandGate
from gateway.control.fleet.on_demand_shared import SharedOnDemand, WorkerEngines, last_requests
from gateway.telemetry.worker_gauges import WorkerGauges
from tests.backends.clients.test_scale_to_zero import FakePools, _od

URL = "http://127.0.0.1:9"


class Workers:
    """What the parent reads of the workers: their newest request per pool and their requests in flight."""

    def __init__(self) -> None:
        self.requests: dict[str, float] = {}
        self.in_flight: dict[str, float] = {}
        self.later_s = 0.0
        """How much later than now the parent looks (time passing without a sleep)."""


def _shared(pools: FakePools, workers: Workers) -> tuple[SharedOnDemand, list[int]]:
    changes: list[int] = []
    shared = SharedOnDemand(pools, lambda: workers.requests, lambda: workers.in_flight,
                            lambda: changes.append(1), later_s=lambda: workers.later_s)
    return shared, changes


async def _until_awake(pools: FakePools, shared: SharedOnDemand, name: str) -> None:
    async with asyncio.timeout(10):
        while shared.waking(name) or name not in pools.supervisors:
            await asyncio.sleep(0.01)


async def test_requests_of_every_worker_wake_the_pool_once() -> None:
    pools, workers = FakePools({"big": _od(idle=60)}), Workers()
    shared, changes = _shared(pools, workers)
    assert await shared.tick() == [] and pools.woken == []  # no worker asked: asleep
    workers.requests["big"] = time.time()
    for _ in range(3):  # asked again (another worker, a later look) while it starts: still one start
        await shared.tick()
        assert shared.waking("big")
    await _until_awake(pools, shared, "big")
    assert pools.woken == ["big"] and changes  # ready: the registry is published again
    await shared.aclose()


async def test_the_pool_sleeps_only_once_no_worker_used_it_for_the_idle_period_and_none_has_one_in_flight() -> None:
    pools, workers = FakePools({"big": _od(idle=2)}), Workers()
    pools.pools["big"].set_urls([URL], ready=True)
    shared, _ = _shared(pools, workers)
    workers.requests["big"] = time.time()
    await shared.tick()
    await _until_awake(pools, shared, "big")
    workers.later_s = 10.0
    workers.requests["big"] = time.time() + 9  # some worker used it a second before the parent's look
    assert await shared.tick() == []
    workers.later_s = 20.0  # 11 s after that request
    workers.in_flight[URL] = 1.0  # a worker's request is still running there
    assert await shared.tick() == []
    workers.in_flight[URL] = 0.0
    assert await shared.tick() == ["big"] and pools.slept == ["big"]
    assert await shared.tick() == [] and pools.woken == ["big"]  # the request before it slept wakes nothing
    workers.requests["big"] = time.time() + 21  # a newer one does
    await shared.tick()
    await _until_awake(pools, shared, "big")
    assert pools.woken == ["big", "big"]
    await shared.aclose()


async def test_a_failed_start_is_tried_again_only_on_a_newer_request() -> None:
    pools, workers = FakePools({"big": _od()}), Workers()
    pools.fail = "no GPU"
    shared, _ = _shared(pools, workers)
    workers.requests["big"] = time.time()
    await shared.tick()
    async with asyncio.timeout(10):
        while shared.waking("big"):
            await asyncio.sleep(0.01)
    await shared.tick()
    assert pools.woken == ["big"]
    pools.fail = None
    workers.requests["big"] = time.time() + 1
    await shared.tick()
    await _until_awake(pools, shared, "big")
    assert pools.woken == ["big", "big"]
    await shared.aclose()


async def test_a_worker_asks_the_parent_and_waits_for_the_published_replicas(tmp_path: Path) -> None:
    pools = FakePools({"big": _od(timeout=10)})
    registry, metrics = tmp_path / "engines", tmp_path / "metrics"
    metrics.mkdir()
    engines = WorkerEngines(pools, registry, lambda: gauges.publish(), poll_s=0.01)
    gauges = WorkerGauges(metrics, [engines])
    gate = OnDemandGate(engines)
    gate.on_use = engines.used
    request = asyncio.create_task(gate.ensure("big"))
    async with asyncio.timeout(10):  # the ask reached the worker's file at once, not on its next second
        while "big" not in last_requests(metrics):
            await asyncio.sleep(0.01)
    assert not request.done() and pools.woken == []  # the worker starts nothing itself
    publish(registry, "big", [URL])
    assert await asyncio.wait_for(request, 10) == "big"
    assert [r.url for r in pools.pools["big"].replicas] == [URL]
    assert not gate.asleep("big")
    await gate.aclose()
