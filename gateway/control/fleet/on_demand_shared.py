"""Scale to zero under `cascade serve --workers N`: the parent, which runs the engines, decides for every worker.

A request for an on-demand pool goes through the worker's `OnDemandGate` as in one process, on a `WorkerEngines`:
- each worker publishes, in its gauge file (`gateway.telemetry.worker_gauges`), when it last had a request for each
  on-demand pool (`cascade_on_demand_last_request_timestamp_seconds{pool, worker}`): every probe interval, and at once
  when the pool is asleep and a request needs it;
- the parent (`SharedOnDemand`, in `gateway.control.engine_host`) reads every live worker's figure a few times a
  second: a request newer than the moment the pool last fell asleep (or failed to start) wakes it, once, whatever
  the number of workers asking; the pool sleeps once no worker has had a request for it for `idle_stop_after_s`
  and none has one in flight to it (`cascade_replica_in_flight`, the workers' live gauge);
- the parent publishes an on-demand pool's replicas in the engine registry only once its engines are ready, and
  none while it is asleep or waking (`EngineHost.publish`); a worker treats a pool with no published replica as
  asleep, and its wake waits for the published replicas (or the request takes the cold fallback, as in one
  process). Every worker follows the registry, so each routes there once they are up.

A worker's figure reaches the parent up to a probe interval late: a request at the very end of an idle period can meet
the pool just as it stops, and then fails over or retries like any request to a replica that went away.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from backends.clients.pool import Pool
from backends.engines.registry import published
from gateway.control.fleet.on_demand import OnDemandGate, OnDemandPools
from gateway.telemetry.worker_gauges import published_gauges
from policies.parallelism import OnDemand

__all__ = ["LAST_REQUEST", "SharedOnDemand", "WorkerEngines", "last_requests"]

log = logging.getLogger("cascade.on_demand")

LAST_REQUEST = "cascade_on_demand_last_request_timestamp_seconds"
WAKE_WAIT_S = 900.0
"""The longest a worker waits for the parent to publish a woken pool's replicas (the gate's own timeout is
usually shorter: past it a request gets its 503, the wait goes on for the next)."""


class WorkerEngines(Collector):
    """A worker's side of scale to zero (`OnDemandPools` for its `OnDemandGate`): a pool is awake when the parent
    has published its replicas in `registry`; `wake` asks the parent and waits for them. As a collector: this
    worker's last request per on-demand pool (register it as the worker's own view). `publish`: write this
    worker's gauge file now."""

    def __init__(self, pools: OnDemandPools, registry: Path, publish: Callable[[], None],
                 poll_s: float = 0.05) -> None:
        self._pools, self._registry, self._publish, self._poll = pools, registry, publish, poll_s
        self.requested: dict[str, float] = {}
        """Wall-clock time of this worker's last request per on-demand pool."""

    @property
    def pools(self) -> Mapping[str, Pool]:
        return self._pools.pools

    @property
    def supervisors(self) -> Mapping[str, object]:
        """The on-demand pools the parent has published replicas for (awake and ready)."""
        return {name: urls for name in self.pools if self.on_demand(name) is not None
                if (urls := published(self._registry, name))}

    def on_demand(self, name: str) -> OnDemand | None:
        return self._pools.on_demand(name)

    def used(self, name: str) -> None:
        """A request for on-demand pool `name` (the gate's `on_use`)."""
        self.requested[name] = time.time()

    async def wake(self, name: str) -> float:
        """Ask the parent to start the engines of `name` and wait until it publishes them; returns the seconds
        waited. Raises `TimeoutError` past `WAKE_WAIT_S` (the next request asks again)."""
        started = time.monotonic()
        self.used(name)
        self._publish()
        while not (urls := published(self._registry, name)):
            if time.monotonic() - started > WAKE_WAIT_S:
                raise TimeoutError(f"the engines of pool {name!r} were not published within {WAKE_WAIT_S:g} s")
            await asyncio.sleep(self._poll)
        pool = self.pools[name]
        await pool.move_to(urls)
        if not pool.ready:
            await pool.probe_once()
        return time.monotonic() - started

    async def sleep(self, name: str, idle_s: float) -> None:
        """Nothing: the parent decides when a pool sleeps."""

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(LAST_REQUEST, "UTC epoch seconds of this worker's last request for each "
                                   "on-demand pool (the parent stops a pool no worker has used for its idle period)",
                                   labels=["pool"])
        for name, at in sorted(self.requested.items()):
            family.add_metric([name], at)
        return [family]


def last_requests(path: Path) -> dict[str, float]:
    """The newest request per on-demand pool over every live worker, read from the metrics folder `path`."""
    out: dict[str, float] = {}
    for _, _, families in published_gauges(path):
        if isinstance(families, Exception):
            continue
        for name, _, samples in families:
            if name == LAST_REQUEST:
                for labels, value in samples:
                    pool = labels.get("pool", "")
                    out[pool] = max(out.get(pool, 0.0), float(value))
    return out


class SharedOnDemand:
    """The parent's side: wakes and stops the on-demand pools of `pools` (its `PoolSet`) on every worker's requests
    (`requests()`: `last_requests` of the metrics folder) and requests in flight (`in_flight()`: per replica URL).
    `changed()` is called when a pool's engines became ready or stopped (publish the registry). Owns its gate and
    its task (`start` / `aclose`)."""

    def __init__(self, pools: OnDemandPools, requests: Callable[[], Mapping[str, float]],
                 in_flight: Callable[[], Mapping[str, float]], changed: Callable[[], None],
                 interval_s: float = 0.25, later_s: Callable[[], float] = lambda: 0.0) -> None:
        """`later_s()`: seconds to add to the clocks (a test's way to let time pass)."""
        self._pools, self._requests, self._in_flight, self._changed = pools, requests, in_flight, changed
        self._later = later_s
        self.gate = OnDemandGate(pools, busy=self._busy)
        self._interval = interval_s
        self._settled: dict[str, float] = {}  # wall-clock time each pool last fell asleep or failed to start
        self._task: asyncio.Task[None] | None = None

    def _busy(self, name: str, pool: Pool) -> bool:
        counts = self._in_flight()
        return any(counts.get(r.url, 0.0) > 0 for r in pool.replicas)

    def waking(self, name: str) -> bool:
        """Are the engines of `name` starting (not to be published yet)?"""
        return self.gate.waking(name)

    async def tick(self) -> list[str]:
        """One look at the workers' requests: wake the pools asked for, stop the idle ones; returns those stopped."""
        now_wall, now_mono = time.time() + self._later(), time.monotonic() + self._later()
        for name, at in self._requests().items():
            if self._pools.on_demand(name) is None:
                continue
            self.gate.used(name, now_mono - max(0.0, now_wall - at))
            if self.gate.asleep(name) and not self.gate.waking(name) and at > self._settled.get(name, 0.0):
                self.gate.wake(name).add_done_callback(functools.partial(self._woke, name))
        stopped = await self.gate.check_idle(now_mono)
        for name in stopped:
            self._settled[name] = now_wall
        if stopped:
            self._changed()
        return stopped

    def _woke(self, name: str, task: asyncio.Task[float]) -> None:
        if task.cancelled() or task.exception() is not None:
            self._settled[name] = time.time() + self._later()  # a request after the failure tries again
        self._changed()

    async def _loop(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception:
                log.exception("the on-demand pools' look at the workers' requests failed")
            await asyncio.sleep(self._interval)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="on-demand-shared")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.gate.aclose()
