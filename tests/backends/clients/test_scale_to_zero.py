"""Scale to zero, fast: the on-demand gate against fake pools (wake / sleep are recorded, not run)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, cast

import pytest

from backends.clients.pool import Pool
from gateway.control.fleet.on_demand import ColdStartTimeout, OnDemandGate
from gateway.errors import NoReplicaAvailable
from policies.parallelism import OnDemand


class FakePools:
    """Pools whose engines 'start' in `start_s` seconds (or fail when `fail` is set)."""

    def __init__(self, settings: Mapping[str, OnDemand | None], start_s: float = 0.05) -> None:
        self._settings = settings
        self.pools = {name: Pool(name, [], cast(Any, None)) for name in settings}
        self.supervisors: dict[str, object] = {}
        self.start_s = start_s
        self.fail: str | None = None
        self.woken: list[str] = []
        self.slept: list[str] = []

    def on_demand(self, name: str) -> OnDemand | None:
        return self._settings.get(name)

    async def wake(self, name: str) -> float:
        self.woken.append(name)
        self.supervisors[name] = object()
        await asyncio.sleep(self.start_s)
        if self.fail:
            del self.supervisors[name]
            raise RuntimeError(self.fail)
        return self.start_s

    async def sleep(self, name: str, idle_s: float) -> None:
        self.slept.append(name)
        self.supervisors.pop(name, None)


def _od(on_cold: str = "wait", timeout: float = 5.0, idle: float = 10.0) -> OnDemand:
    return OnDemand(idle_stop_after_s=idle, cold_start_timeout_s=timeout, on_cold=on_cold)


async def _started(gate: OnDemandGate, name: str, timeout_s: float = 10.0) -> None:
    """Until the gate has recorded the pool's cold start as done (not a fixed sleep: a loaded machine runs late)."""
    async with asyncio.timeout(timeout_s):
        while not gate.cold_starts.get(name):
            await asyncio.sleep(0.01)


async def test_ordinary_pool_passes_through_without_waking() -> None:
    pools = FakePools({"micro": None})
    assert await OnDemandGate(pools).ensure("micro") == "micro"
    assert pools.woken == []


async def test_concurrent_requests_share_one_cold_start_then_wait_for_it() -> None:
    pools = FakePools({"big": _od()})
    gate = OnDemandGate(pools)
    got = await asyncio.gather(*(gate.ensure("big") for _ in range(5)))
    assert got == ["big"] * 5 and pools.woken == ["big"]
    assert gate.cold_starts["big"] == [pools.start_s]
    assert await gate.ensure("big") == "big" and pools.woken == ["big"]  # awake now: no second start


async def test_timeout_is_a_503_with_retry_after_and_the_start_goes_on() -> None:
    pools = FakePools({"big": _od(timeout=0.05)}, start_s=0.3)
    gate = OnDemandGate(pools)
    with pytest.raises(ColdStartTimeout) as caught:
        await gate.ensure("big")
    assert caught.value.status == 503 and caught.value.code == "cold_start_timeout"
    assert 1 <= int(caught.value.headers()["retry-after"]) <= 5
    await _started(gate, "big")
    assert await gate.ensure("big") == "big" and pools.woken == ["big"]


async def test_fallback_serves_while_the_pool_starts() -> None:
    pools = FakePools({"big": _od(on_cold="fallback:micro"), "micro": None}, start_s=0.1)
    gate = OnDemandGate(pools)
    assert await gate.ensure("big") == "micro"
    assert await gate.ensure("big") == "micro"  # still starting
    await _started(gate, "big")
    assert await gate.ensure("big") == "big" and pools.woken == ["big"]


async def test_a_fallback_the_tenant_may_not_use_waits_for_the_cold_start() -> None:
    pools = FakePools({"big": _od(on_cold="fallback:micro"), "micro": None}, start_s=0.1)
    gate = OnDemandGate(pools)
    assert await gate.ensure("big", lambda pool: pool != "micro") == "big"  # waited for "big" instead
    assert pools.woken == ["big"]


async def test_failed_cold_start_is_a_503_and_the_next_request_tries_again() -> None:
    pools = FakePools({"big": _od()})
    pools.fail = "engine exited with code 1"
    gate = OnDemandGate(pools)
    with pytest.raises(NoReplicaAvailable, match="could not start on demand: engine exited with code 1"):
        await gate.ensure("big")
    pools.fail = None
    assert await gate.ensure("big") == "big" and pools.woken == ["big", "big"]


async def test_idle_pool_sleeps_after_idle_stop_after_s_but_not_while_busy() -> None:
    pools = FakePools({"big": _od(idle=10.0), "micro": None})
    gate = OnDemandGate(pools)
    await gate.ensure("big")
    t0 = asyncio.get_running_loop().time()
    assert await gate.check_idle(t0 + 5) == []
    pools.pools["big"].set_urls(["http://127.0.0.1:1"])
    pools.pools["big"].replicas[0].in_flight = 1
    assert await gate.check_idle(t0 + 60) == []  # a request in flight keeps it awake
    pools.pools["big"].replicas[0].in_flight = 0
    assert await gate.check_idle(t0 + 60) == ["big"] and pools.slept == ["big"]
    assert await gate.ensure("big") == "big" and pools.woken == ["big", "big"]  # wakes again on demand
