"""Scale to zero: wake an on-demand pool on the request that needs it, put it to sleep when idle.

`OnDemandGate.ensure(pool)` runs once per request, after routing: for an ordinary pool it returns the
name at once. For a pool with `on_demand` settings whose engines are stopped it starts them (one cold
start per pool, shared by every request that arrives meanwhile) and then either waits for them, up to
`cold_start_timeout_s` (past that: `ColdStartTimeout`, a 503 with Retry-After; the start goes on), or
returns the `fallback:<pool>` to serve this request while the engines start. A background task stops
the engines of a pool that has had no request for `idle_stop_after_s` and nothing in flight.
The engines themselves are the `PoolSet`'s (`wake` / `sleep`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

from backends.clients.pool import Pool
from gateway.errors import NoReplicaAvailable, RetryLater
from policies.parallelism import OnDemand

__all__ = ["ColdStartTimeout", "OnDemandGate", "OnDemandPools", "Wake"]

Wake = Callable[[str, Callable[[str], bool] | None], Awaitable[str]]
"""`OnDemandGate.ensure`: (pool, may the request be moved to this fallback pool?) -> the pool that serves."""

log = logging.getLogger("cascade.on_demand")


class ColdStartTimeout(NoReplicaAvailable, RetryLater):
    """503: the pool's engines are starting and did not get ready within `cold_start_timeout_s`."""

    code = "cold_start_timeout"


class OnDemandPools(Protocol):
    """What the gate needs from the pools (`gateway.control.fleet.pool_set.PoolSet` is one)."""

    @property
    def pools(self) -> Mapping[str, Pool]: ...

    @property
    def supervisors(self) -> Mapping[str, object]: ...

    def on_demand(self, name: str) -> OnDemand | None: ...

    async def wake(self, name: str) -> float: ...

    async def sleep(self, name: str, idle_s: float) -> None: ...


class OnDemandGate:
    """Owns the wake tasks, the last-use times and the idle task (`start` / `aclose`)."""

    def __init__(self, pools: OnDemandPools, check_interval_s: float = 1.0,
                 busy: Callable[[str, Pool], bool] | None = None) -> None:
        """`busy(name, pool)`: does the pool have requests in flight (default: this process's own)? Under
        `--workers N` the parent asks the workers' (`gateway.control.fleet.on_demand_shared`)."""
        self._pools = pools
        self._busy = busy or (lambda _name, pool: pool.in_flight > 0)
        self.on_use: Callable[[str], None] | None = None
        """Told of every request for an on-demand pool (a worker publishes it for the parent)."""
        self._interval = check_interval_s
        self._last_used: dict[str, float] = {}
        self._waking: dict[str, asyncio.Task[float]] = {}
        self._wake_started: dict[str, float] = {}
        self.cold_starts: dict[str, list[float]] = {}
        """Seconds each finished cold start took, per pool (newest last)."""
        self._task: asyncio.Task[None] | None = None

    def asleep(self, name: str) -> bool:
        """Are the engines of `name` stopped or still starting?"""
        return name not in self._pools.supervisors or name in self._waking

    def sleeping(self, name: str) -> bool:
        """Is `name` an on-demand pool whose engines are stopped or still starting (a request would wake it)?"""
        return self._pools.on_demand(name) is not None and self.asleep(name)

    def waking(self, name: str) -> bool:
        return name in self._waking

    def used(self, name: str, at: float) -> None:
        """A request for `name` at `at` (monotonic) seen elsewhere (another process's): idle counts from there."""
        self._last_used[name] = max(self._last_used.get(name, at), at)

    async def ensure(self, name: str, may_use: Callable[[str], bool] | None = None) -> str:
        """The pool that serves this request: `name`, once awake, or its cold fallback where `may_use(fallback)`
        (the tenant may be moved there; otherwise it waits, as with `on_cold: wait`). Raises `ColdStartTimeout`
        past the pool's timeout, `NoReplicaAvailable` when its engines fail to start."""
        settings = self._pools.on_demand(name)
        if settings is None:
            return name
        self._last_used[name] = time.monotonic()
        if self.on_use is not None:
            self.on_use(name)
        if not self.asleep(name):
            return name
        task = self.wake(name)
        fallback = settings.fallback_pool
        if fallback is not None and (may_use is None or may_use(fallback)):
            return fallback
        try:
            await asyncio.wait_for(asyncio.shield(task), settings.cold_start_timeout_s)
        except TimeoutError:
            raise ColdStartTimeout(
                f"pool {name!r} is starting on demand and was not ready within {settings.cold_start_timeout_s:g} s; "
                "retry later", self._retry_after(name, settings)) from None
        except Exception as exc:
            raise NoReplicaAvailable(f"pool {name!r} could not start on demand: {str(exc).splitlines()[0]}") from exc
        self._last_used[name] = time.monotonic()
        return name

    def _retry_after(self, name: str, settings: OnDemand) -> int:
        """Seconds until the running cold start should be done: the last one's duration (or the timeout)
        minus the time it has run."""
        expected = (self.cold_starts.get(name) or [settings.cold_start_timeout_s])[-1]
        running = time.monotonic() - self._wake_started.get(name, time.monotonic())
        return max(1, math.ceil(expected - running))

    def wake(self, name: str) -> asyncio.Task[float]:
        """The cold start of `name`: the running one, else a new one."""
        task = self._waking.get(name)
        if task is None:
            log.warning("pool %s is asleep: starting its engines on demand", name)
            self._wake_started[name] = time.monotonic()
            task = asyncio.create_task(self._pools.wake(name), name=f"wake:{name}")
            self._waking[name] = task
            task.add_done_callback(lambda t: self._woke(name, t))
        return task

    def _woke(self, name: str, task: asyncio.Task[float]) -> None:
        self._waking.pop(name, None)
        self._last_used[name] = time.monotonic()
        if not task.cancelled() and task.exception() is None:
            self.cold_starts.setdefault(name, []).append(task.result())
        elif not task.cancelled():
            log.error("pool %s: cold start failed: %s", name, task.exception())

    async def check_idle(self, now: float | None = None) -> list[str]:
        """Stop every awake on-demand pool idle for longer than its `idle_stop_after_s`; returns their names."""
        now = time.monotonic() if now is None else now
        stopped: list[str] = []
        for name, pool in list(self._pools.pools.items()):
            settings = self._pools.on_demand(name)
            if settings is None or self.asleep(name) or self._busy(name, pool):
                continue
            idle = now - self._last_used.setdefault(name, now)
            if idle >= settings.idle_stop_after_s:
                await self._pools.sleep(name, idle)
                stopped.append(name)
        return stopped

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.check_idle()
            except Exception:
                log.exception("idle check of on-demand pools failed")

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="on-demand-idle")

    async def aclose(self) -> None:
        tasks = [t for t in (self._task, *self._waking.values()) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
