"""The engines of `cascade serve --workers N`, run by the parent process, which serves no requests.

The parent runs the same `PoolSet` a single gateway process runs, so every engine change applies there alike:
blue-green and rolling changes, canaries, autoscaling, replicas followed to a new port. Besides it:
- a policy file watcher reconciles the pool set with the file (the workers watch it too, for routing);
- a publisher writes where each pool's replicas listen, and its canary's (`<pool>.canary`), into the registry
  the workers follow (`backends.engines.registry`), whenever that changes;
- a replica taken out of routing is stopped once no worker has a request in flight to it (read from the metrics
  folder they share: `cascade_replica_in_flight`, a live gauge per worker) and every live worker has shown that it
  no longer routes there: its view (`worker_gauges.worker_views`, published every second) was written after the
  replica left routing and does not hold it. A worker the machine stalls past its probe interval is waited for
  (up to the drain's grace), not assumed to have followed; and not before `DRAIN_FLOOR_S`;
- on-demand pools (scale to zero) are woken and stopped here on every worker's requests
  (`gateway.control.fleet.on_demand_shared.SharedOnDemand`); their replicas are published once ready, none while asleep;
- the autoscaler's signals are the engines' own (KV cache, queue, scraped by the parent's probes) and the
  workers' in-flight count; the gateway's TTFT is not seen here.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry, multiprocess

from backends.background import close_each, stop
from backends.clients.shared import make_engine_client
from backends.engines.args import otlp_traces_endpoint
from backends.engines.registry import publish
from backends.engines.supervisor import CommandFactory, EngineSupervisor
from gateway.control.adaptation.degradation import engine_signals
from gateway.control.fleet.autoscale import Autoscaler
from gateway.control.fleet.on_demand_shared import SharedOnDemand, last_requests
from gateway.control.fleet.pool_build import engine_load_read
from gateway.control.fleet.pool_set import PoolSet
from gateway.control.policy.file_watch import FileWatcher
from gateway.settings import Settings
from gateway.telemetry.parent_counters import ParentCounters
from gateway.telemetry.worker_gauges import WorkerView, still_routing, worker_views
from policies.loader import LoadedPolicy, load_policy

__all__ = ["DRAIN_FLOOR_S", "EngineHost", "workers_in_flight"]

log = logging.getLogger("cascade.engines")
T = TypeVar("T")

DRAIN_FLOOR_S = 3.0
"""A replica the parent takes out of service keeps running at least this long, whatever the workers' views say."""


def workers_in_flight(metrics_dir: Path) -> dict[str, float]:
    """Requests every live worker has in flight, per replica URL, from the workers' shared metrics folder."""
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, str(metrics_dir))  # type: ignore[no-untyped-call]
    out: dict[str, float] = {}
    for family in registry.collect():
        if family.name == "cascade_replica_in_flight":
            for sample in family.samples:
                url = sample.labels.get("replica", "")
                out[url] = out.get(url, 0.0) + sample.value
    return out


class _Recent(Generic[T]):
    """The workers' figure `read` gives, read again once `max_age_s` old (the drain and the autoscaler ask many times
    a second); a read that fails keeps the last one, logged."""

    def __init__(self, read: Callable[[], T], what: str, first: T, max_age_s: float = 0.2) -> None:
        self._read, self._what, self._value, self._max_age = read, what, first, max_age_s
        self._at = 0.0

    def get(self) -> T:
        if time.monotonic() - self._at > self._max_age:
            try:
                self._value = self._read()
            except (OSError, ValueError) as exc:
                log.warning("could not read the workers' %s: %s", self._what, exc)
            self._at = time.monotonic()
        return self._value


class EngineHost:
    """Owns the parent's pool set, its watcher, publisher and autoscaler (`start` / `aclose`). Engine restarts
    and the autoscaler's changes are counted in `metrics_dir` (`gateway.telemetry.parent_counters`), where the
    workers' `/metrics` reads them."""

    def __init__(self, settings: Settings, registry: Path, metrics_dir: Path, command: CommandFactory) -> None:
        self._settings = settings
        self._registry = registry
        self._metrics_dir = metrics_dir
        self._client = make_engine_client(settings.transport)
        self.pool_set = PoolSet(settings, self._client, elsewhere=self._elsewhere, drain_floor_s=DRAIN_FLOOR_S,
                                traces_to=otlp_traces_endpoint(os.environ),
                                supervisor=functools.partial(EngineSupervisor, command=command))
        self.counters = ParentCounters(metrics_dir)
        self.pool_set.on_engine_restart = self.counters.engine_restarted
        self.pool_set.builder.load_read = self._load_read
        self._loaded: LoadedPolicy | None = None
        self._lock = asyncio.Lock()
        self._published: dict[str, tuple[str, ...]] = {}
        self._counts: _Recent[dict[str, float]] = _Recent(functools.partial(workers_in_flight, metrics_dir),
                                                          "in-flight counts", {})
        self._views: _Recent[list[WorkerView]] = _Recent(functools.partial(worker_views, metrics_dir), "views", [])
        self._tasks: list[asyncio.Task[None]] = []
        self._watcher = FileWatcher([settings.policy_path], self.reload, settings.policy_watch_interval_s,
                                    retry_s=max(1.0, 7.5 * settings.policy_watch_interval_s))
        self.autoscaler = Autoscaler(self.pool_set, self._signals, self.counters.scale_event, settings.probe_interval_s)
        self.on_demand = SharedOnDemand(self.pool_set, functools.partial(last_requests, metrics_dir),
                                        self._counts.get, self._published_now)

    async def start(self) -> None:
        """Start every pool's engines (in the background, as in one process) and the loops."""
        self._loaded = load_policy(self._settings.policy_path)
        PoolSet.check(self._loaded)
        await self.pool_set.start(self._loaded.policy)
        self._tasks.append(asyncio.create_task(self._publish_loop(), name="engine-registry"))
        if self._settings.policy_watch_interval_s > 0:
            self._watcher.start()
        self.autoscaler.start()
        self.on_demand.start()

    async def reload(self) -> None:
        """Reconcile the engines with the policy file (the file watcher calls it). Raises `PolicyError`, or
        `PolicyNotApplied` for a change that may apply later; the engines stay as they were."""
        async with self._lock:
            fresh = load_policy(self._settings.policy_path)
            if self._loaded is not None and fresh.version == self._loaded.version:
                return
            await self.pool_set.apply(fresh)
            self.pool_set.retire_unused(fresh.policy)
            self._loaded = fresh
            self.publish()
            log.info("engines reconciled with the policy", extra={"policy_version": fresh.version})

    def publish(self) -> None:
        """Write the registry entries that changed: each local pool's replicas and its canary's (none: empty)."""
        wanted: dict[str, tuple[str, ...]] = {name: () for name in self.pool_set.pools
                                              if self.pool_set.on_demand(name) is not None}  # asleep: none
        for name, sup in self.pool_set.supervisors.items():
            wanted[name] = () if self.on_demand.waking(name) else sup.urls  # an on-demand pool: once ready
            canary = self.pool_set.canaries.get(name)
            wanted[f"{name}.canary"] = tuple(r.url for r in canary.pool.replicas) if canary is not None else ()
        for key, urls in wanted.items():
            if self._published.get(key) != urls:
                publish(self._registry, key, urls)
                self._published[key] = urls

    def _published_now(self) -> None:
        try:
            self.publish()
        except OSError as exc:
            log.warning("could not publish the engines' ports: %s", exc)

    async def _publish_loop(self) -> None:
        while True:
            try:
                self.publish()
            except OSError as exc:
                log.warning("could not publish the engines' ports: %s", exc)
            await asyncio.sleep(0.5)

    def _elsewhere(self, url: str, since: float) -> int:
        """The workers' requests in flight to `url`, plus the workers that may still send it new ones: those
        whose view was written before `since` (the moment it left routing) or still holds it."""
        url = url.rstrip("/")
        return int(self._counts.get().get(url, 0.0)) + still_routing(self._views.get(), url, since)

    def _load_read(self, name: str) -> bool:
        return self._loaded is None or engine_load_read(self._loaded.policy, name)

    def _signals(self, now: float) -> Mapping[tuple[str, str], float]:
        counts = self._counts.get()
        out: dict[tuple[str, str], float] = {}
        for name, pool in self.pool_set.pools.items():
            out.update(engine_signals(name, pool))
            out[("in_flight", name)] = sum(counts.get(r.url, 0.0) for r in pool.replicas)
        return out

    async def aclose(self) -> None:
        """Stop the loops, then every pool and its engines, then the client: each whatever the others do, a
        failure logged with what failed (`backends.background.close_each`), never swallowed."""
        await close_each([("the autoscaler", self.autoscaler.aclose), ("the on-demand pools", self.on_demand.aclose),
                          ("the policy watcher", self._watcher.aclose),
                          *((f"task {t.get_name()}", functools.partial(stop, t)) for t in self._tasks),
                          ("the pool set", self.pool_set.aclose), ("the engine client", self._client.aclose)],
                         log, in_turn=True)
