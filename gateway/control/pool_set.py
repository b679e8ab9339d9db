"""The running pools of a policy: built at start, reconciled on every policy reload.

Local pools' engines start in the background (so the gateway answers /healthz and /readyz, with
progress, while engines load). On reload, added pools start and removed pools stop once their in-flight
requests are done (bounded by a grace period): requests in flight keep the `Pool` object they started with.
A pool whose engines change is changed without going dark where it can be (`gateway.control.pool_change`):
its new engines start beside the old ones, take traffic once ready, and the old ones drain and stop. A
replica that restarts on another port (its own was taken) is followed there.

A local pool's canary (`canary:` in the policy) runs as a second engine version beside the pool's own, in a `Pool`
of its own (`canaries`, read by the request path: `gateway.control.canaries`). A reload that adds or changes a
canary starts it before the reload answers; one that removes it drains and stops it; one whose pool engine is
the running canary's engine (`cascade pool promote`) makes the canary the pool without starting anything. A
canary its guard rolled back stays stopped until the policy changes or removes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from backends.clients.breaker import BreakerConfig
from backends.clients.pool import Pool, Replica
from backends.clients.shared import EngineClient
from backends.engines.args import resolve_model
from backends.engines.cpu_pinning import cores_beside, parse_cpus
from backends.engines.registry import REGISTRY_ENV, published
from backends.engines.room import NoRoom, judge_room
from backends.engines.supervisor import Answered, EngineStartError, EngineSupervisor, RestartHook
from backends.engines.supervisor import Replica as EngineReplica
from backends.machine_checks import checked_here, connection_settings
from backends.models.demo import models_root
from gateway.control.canaries import CanaryGuard, CanaryRoute
from gateway.control.pool_change import ChangePlan, PolicyNotApplied, PoolChangeRefused, plan_change
from gateway.settings import Settings
from policies.loader import LoadedPolicy, PolicyError
from policies.parallelism import OnDemand
from policies.pools import engine_version, pool_version
from policies.schema import LocalPool, Policy, RemotePool

__all__ = ["PoolSet"]

log = logging.getLogger("cascade.pools")

REPLACE_WAIT_S = 30.0
"""How long a reload waits for a serving remote pool's new replica set to answer before it refuses the change."""


class PoolSet:
    """Owns the pools (a dict shared with the service), their supervisors and the background tasks."""

    def __init__(self, settings: Settings, client: EngineClient, progress: Callable[[str], None] | None = None,
                 drain_grace_s: float = 60.0, elsewhere: Callable[[str], int] | None = None, drain_floor_s: float = 0.0,
                 supervisor: Callable[..., EngineSupervisor] | None = None) -> None:
        """`elsewhere(url)`: requests other processes have in flight to the replica at `url` (the workers of
        `--workers N`, for the parent that runs their engines and serves nothing itself); a replica drains until
        those end too, and not before `drain_floor_s` (the time the others take to stop sending it new ones).
        `supervisor`: how engine supervisors are made (default `EngineSupervisor`)."""
        self._elsewhere = elsewhere
        self._drain_floor_s = drain_floor_s
        self._make_supervisor = supervisor
        self._settings = settings
        self._client = client
        self._progress = progress
        self._grace = drain_grace_s
        self.pools: dict[str, Pool] = {}
        self.specs: dict[str, LocalPool | RemotePool] = {}
        self.supervisors: dict[str, EngineSupervisor] = {}
        self.status: dict[str, str] = {}
        self.on_engine_restart: RestartHook | None = None  # (pool, replica index, "exited" | "hung"): metrics
        self.start_took: dict[str, float] = {}  # seconds the pool's engines took to start, the last time
        registry = os.environ.get(REGISTRY_ENV)  # set by the parent of `--workers N`, which runs the engines
        self._registry = Path(registry) if registry and not settings.start_engines else None
        self._tasks: set[asyncio.Task[None]] = set()
        self.canaries: dict[str, CanaryRoute] = {}
        self._canary_sups: dict[str, EngineSupervisor] = {}
        self.rolled_back: dict[str, tuple[str, str]] = {}  # pool: (canary version, why its guard rolled it back)
        self.guard = CanaryGuard(self.canaries, self._guard_tripped)
        self._generations: dict[str, int] = {}
        self._starting_canary: dict[str, str] = {}  # pool: version of the canary starting with the pool
        self._rolling: set[str] = set()  # pools whose replicas are being replaced a few at a time

    @staticmethod
    def check(loaded: LoadedPolicy) -> None:
        """Refuse a policy whose pools cannot run on this machine as written (a quantized checkpoint over its
        `max_quant_loss` ceiling, an unusable TLS file). Call before `start` or `reconcile`; raises
        `PolicyError` with file:line."""
        checked_here(loaded)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _static_urls(self, name: str, spec: LocalPool | RemotePool) -> list[str]:
        if isinstance(spec, RemotePool):
            return list(spec.urls)
        if self._settings.start_engines:
            return []  # filled in once the supervisor has them up
        urls = None if self._registry is None else published(self._registry, name)
        if urls is not None:  # where the process running the engines says they listen
            return list(urls)
        return [f"http://127.0.0.1:{spec.engine.base_port + i}" for i in range(spec.engine.replicas)]

    async def _follow(self, name: str, pool: Pool) -> None:
        """Route to the ports the engine-running process publishes, while `pool` is the pool of `name`."""
        assert self._registry is not None
        while self.pools.get(name) is pool:
            canary = self.canaries.get(name)
            for key, followed in [(name, pool), *([(f"{name}.canary", canary.pool)] if canary is not None else [])]:
                urls = published(self._registry, key)
                if urls is not None and [u.rstrip("/") for u in urls] != [r.url for r in followed.replicas]:
                    log.info("%s: its engines now listen on %s", key, ", ".join(urls))
                    await followed.move_to(urls)
            await asyncio.sleep(self._settings.probe_interval_s)

    @staticmethod
    def _headers(name: str, spec: LocalPool | RemotePool) -> dict[str, str]:
        """A remote pool's API key, read from the environment variable the policy names (never stored)."""
        if isinstance(spec, LocalPool) or spec.api_key_env is None:
            return {}
        key = os.environ.get(spec.api_key_env)
        if not key:
            log.warning("pool %s: environment variable %s is not set; calling it without an API key",
                        name, spec.api_key_env)
            return {}
        return {"authorization": f"Bearer {key}"}

    def _pool(self, name: str, spec: LocalPool | RemotePool, urls: list[str] | None = None) -> Pool:
        health = spec.health_path if isinstance(spec, RemotePool) else "/health"
        breaker = BreakerConfig(**spec.breaker.model_dump())
        connection = connection_settings(spec) if isinstance(spec, RemotePool) else None
        return Pool(name, self._static_urls(name, spec) if urls is None else urls, self._client,
                    probe_interval_s=self._settings.probe_interval_s, health_path=health,
                    headers=self._headers(name, spec), breaker=breaker, connection=connection,
                    version=pool_version(spec))

    async def add(self, name: str, spec: LocalPool | RemotePool) -> None:
        pool = self._pool(name, spec)
        await pool.probe_once()
        pool.start()
        self.pools[name], self.specs[name] = pool, spec
        self.status[name] = "remote" if isinstance(spec, RemotePool) else "external"
        if isinstance(spec, LocalPool) and self._registry is not None:
            self._spawn(self._follow(name, pool), f"follow:{name}")
        if isinstance(spec, LocalPool) and self._settings.start_engines:
            if spec.on_demand is not None:
                self.status[name] = "sleeping (on demand: starts on the first request)"
                return
            self.status[name] = "starting"
            self._spawn(self._start_engines(name, spec, pool), f"engines:{name}")
        elif isinstance(spec, LocalPool) and spec.canary is not None:
            self._spawn(self._start_canary_now(name, spec), f"canary:{name}")

    def _engine_restarted(self, pool: str, index: int, reason: str) -> None:
        if self.on_engine_restart is not None:
            self.on_engine_restart(pool, index, reason)

    def on_demand(self, name: str) -> OnDemand | None:
        """The scale-to-zero settings of pool `name` when this process starts its engines, else None."""
        spec = self.specs.get(name)
        if isinstance(spec, LocalPool) and self._settings.start_engines:
            return spec.on_demand
        return None

    def readiness(self) -> dict[str, bool]:
        """Per pool: can it take requests now? A sleeping on-demand pool counts as ready (it wakes on use)."""
        return {name: pool.ready or (self.on_demand(name) is not None and name not in self.supervisors)
                for name, pool in self.pools.items()}

    def required_for_ready(self) -> frozenset[str]:
        """The pools without which the gateway is not ready (the policy's `required_for_ready`)."""
        return frozenset(name for name, spec in self.specs.items() if spec.needed_for_ready)

    async def wake(self, name: str) -> float:
        """Start the engines of sleeping on-demand pool `name`; returns the cold-start seconds once they
        are ready. Raises `EngineStartError` (the pool stays asleep; the next request tries again)."""
        spec, pool = self.specs[name], self.pools[name]
        assert isinstance(spec, LocalPool)
        self.status[name] = "waking (cold start)"
        try:
            took = await self._launch(name, spec, pool)
        except BaseException as exc:
            self.supervisors.pop(name, None)
            self.status[name] = f"sleeping (the last cold start failed: {str(exc).splitlines()[0]})"
            raise
        self.status[name] = f"awake (cold start took {took:.1f} s)"
        log.info("pool %s woke up in %.1f s", name, took)
        return took

    async def sleep(self, name: str, idle_s: float) -> None:
        """Stop the engines of on-demand pool `name` (call when it has nothing in flight)."""
        sup = self.supervisors.pop(name, None)
        pool = self.pools.get(name)
        if pool is not None:
            pool.set_urls([])
        self.status[name] = f"sleeping (stopped after {idle_s:.0f} s idle)"
        if sup is not None:
            await sup.aclose()
        log.info("pool %s stopped after %.0f s idle", name, idle_s)

    def _supervisor(self, name: str, spec: LocalPool, pool: Pool, beside: EngineSupervisor | None = None
                    ) -> EngineSupervisor:
        """A supervisor for the pool's engines (a new generation: its own log files) whose port moves `pool`
        follows while it serves, as the pool or as its canary. `beside`: the serving version it starts beside
        (its workers, and its processes while it starts, are kept off that version's cores: `_beside`)."""
        spec, start_on = _beside(spec, beside) if beside is not None else (spec, None)
        def moved(urls: tuple[str, ...]) -> None:
            canary = self.canaries.get(name)
            if name in self._rolling:  # `_roll` sets the pool's replicas itself, from both versions
                return
            if self.pools.get(name) is pool or (canary is not None and canary.pool is pool):
                pool.set_urls(urls)

        generation = self._generations.get(name, -1) + 1
        self._generations[name] = generation
        factory = self._make_supervisor or EngineSupervisor
        sup = factory(name, spec.engine, home=self._settings.home, progress=self._progress,
                               on_restart=self._engine_restarted, answered=_last_answer(pool), on_urls=moved,
                               generation=generation, start_on=start_on)
        return sup

    async def _launch(self, name: str, spec: LocalPool, pool: Pool) -> float:
        """Start the pool's engines under a (registered) supervisor, point the pool at them and probe them;
        returns the seconds it took. Raises what the supervisor's start raised."""
        sup = self._supervisor(name, spec, pool)
        self.supervisors[name] = sup
        started = time.monotonic()
        await sup.start()
        pool.set_urls(sup.urls)
        await pool.probe_once()
        took = self.start_took[name] = time.monotonic() - started
        return took

    async def _start_engines(self, name: str, spec: LocalPool, pool: Pool) -> None:
        try:
            took = await self._launch(name, spec, pool)
        except Exception as exc:
            self.status[name] = f"failed: {exc}"
            log.error("engines of pool %s failed to start: %s", name, exc)
            return
        self.status[name] = f"ready after {took:.0f} s"
        if spec.canary is not None and self.pools.get(name) is pool:  # after the pool: it starts beside it
            await self._start_canary_now(name, spec)

    async def _start_canary_now(self, name: str, spec: LocalPool) -> None:
        """Start the canary of a pool the gateway has just started; a failure is logged and reported in /readyz,
        the pool serves alone."""
        assert spec.canary is not None
        self._starting_canary[name] = version = engine_version(spec.canary.engine)
        try:
            route, sup = await self._start_canary(name, spec)
        except Exception as exc:
            self.status[name] = self.status.get(name, "") + f"; its canary failed to start: {exc}"
            log.error("canary of pool %s failed to start: %s", name, exc)
            return
        finally:
            self._starting_canary.pop(name, None)
        current = self.specs.get(name)
        wanted = current.canary if isinstance(current, LocalPool) else None
        if wanted is None or engine_version(wanted.engine) != version or name in self.canaries:
            await _close(route.pool, sup)  # a reload meanwhile changed or removed it
            return
        self._install_canary(name, replace(route, weight=wanted.weight, guard=wanted.guard), sup)

    async def _start_canary(self, name: str, spec: LocalPool) -> tuple[CanaryRoute, EngineSupervisor | None]:
        """Start `spec`'s canary engines (beside the pool's, off their cores on a CPU host) or, where this
        process runs no engines, point at them (`base_port + i`, or the published ports). Raises what the
        supervisor's start raised (it stops what it started)."""
        canary = spec.canary
        assert canary is not None
        as_pool = spec.model_copy(update={"engine": canary.engine, "canary": None})
        version, model = engine_version(canary.engine), canary.engine.served_name
        if not self._settings.start_engines:
            pool = self._pool(name, as_pool, self._static_urls(f"{name}.canary", as_pool))
            await pool.probe_once()
            pool.start()
            return CanaryRoute(pool, version, model, canary.weight, canary.guard), None
        pool = self._pool(name, as_pool, [])
        stable = self.supervisors.get(name)
        sup = self._supervisor(name, as_pool, pool, beside=stable)
        started = time.monotonic()
        await sup.start()
        log.info("pool %s: canary %s started in %.0f s", name, version, time.monotonic() - started)
        pool.set_urls(sup.urls, ready=True)
        pool.start()
        return CanaryRoute(pool, version, model, canary.weight, canary.guard), sup

    def _install_canary(self, name: str, route: CanaryRoute, sup: EngineSupervisor | None) -> None:
        """Send the canary its share of the pool's requests from now on (a canary it replaces drains)."""
        self._drop_canary(name)
        self.canaries[name] = route
        if sup is not None:
            self._canary_sups[name] = sup
        self.rolled_back.pop(name, None)
        log.info("pool %s: canary %s takes %.1f%% of its requests", name, route.version, route.weight * 100)

    def _drop_canary(self, name: str) -> None:
        """Stop sending requests to the canary of `name` (if any); it drains and stops in the background."""
        route, sup = self.canaries.pop(name, None), self._canary_sups.pop(name, None)
        self.guard.forget(name)
        if route is not None:
            self._spawn(self._retire(f"{name} (canary {route.version})", route.pool, sup), f"canary-retire:{name}")

    def _guard_tripped(self, name: str, version: str, reason: str) -> None:
        self.rolled_back[name] = (version, reason)
        self._drop_canary(name)

    def supervisors_of_canary(self, name: str) -> tuple[EngineReplica, ...]:
        """The replicas of the running canary of `name` that this process supervises (none: no canary here)."""
        sup = self._canary_sups.get(name)
        return sup.replicas if sup is not None else ()

    def versions(self) -> dict[str, dict[str, object]]:
        """Per pool, the engine version serving it and its canary (version, model, weight, ready), or the canary
        its guard rolled back and why: /readyz's `versions`."""
        out: dict[str, dict[str, object]] = {}
        for name, pool in self.pools.items():
            entry: dict[str, object] = {"version": pool.version}
            route = self.canaries.get(name)
            if route is not None:
                entry["canary"] = {"version": route.version, "model": route.model, "weight": route.weight,
                                   "ready": route.pool.ready}
            elif name in self.rolled_back:
                version, reason = self.rolled_back[name]
                entry["canary"] = {"version": version, "rolled_back": reason}
            out[name] = entry
        return out

    async def scale_up(self, name: str) -> int:
        """Start one more replica of local pool `name` beside its others (off their cores on a CPU host) and
        route to it once it answers; returns the replicas now. Raises `NoRoom` (the machine cannot hold one more:
        memory for its KV cache, weights and processes, or free GPU memory) or what the supervisor's start
        raised (the pool keeps its replicas)."""
        spec, sup, pool = _local(self.specs[name]), self.supervisors[name], self.pools[name]
        model_dir = Path(resolve_model(spec.engine, models_root(self._settings.home)))
        room = await asyncio.to_thread(judge_room, spec.engine.model_copy(update={"replicas": 1}), model_dir)
        if room.fits < 1:
            raise NoRoom(room.how)
        bind = _bind_beside(spec, sup)
        env = {} if bind is None else {"VLLM_CPU_OMP_THREADS_BIND": bind}
        await sup.add_replica(env, None if bind is None else parse_cpus(bind))
        if self.pools.get(name) is pool and self.supervisors.get(name) is sup:
            pool.set_urls(sup.urls, ready=True)
            await pool.probe_once()
        return len(sup.replicas)

    async def scale_down(self, name: str) -> int:
        """Take the newest replica of local pool `name` out of routing, let its requests finish (streams
        included, bounded by the grace period), then stop it; returns the replicas now."""
        sup, pool = self.supervisors[name], self.pools[name]
        replica = max(sup.replicas, key=lambda r: r.index)
        draining = [r for r in pool.replicas if r.url == replica.url]
        sup.detach(replica)  # the pool follows the supervisor's URLs: no new request reaches it
        try:
            await self._drained(draining)
        finally:
            await sup.stop(replica)
        return len(sup.replicas)

    def remove(self, name: str) -> None:
        """Take the pool (and its canary) out of routing now; stop it once idle (or after the grace period)."""
        self._drop_canary(name)
        self.rolled_back.pop(name, None)
        pool = self.pools.pop(name)
        self.specs.pop(name)
        self.status.pop(name, None)
        self._spawn(self._retire(name, pool, self.supervisors.pop(name, None)), f"retire:{name}")

    async def _retire(self, name: str, pool: Pool, sup: EngineSupervisor | None) -> None:
        try:
            await self._drained(pool.replicas)
        finally:  # also when shutdown cancels the wait: the engines must not outlive the gateway
            await pool.aclose()
            if sup is not None:
                await sup.aclose()
        log.info("pool %s stopped", name)

    async def _drained(self, replicas: list[Replica]) -> None:
        """Wait until no request is in flight on `replicas` (bounded by the grace period)."""
        started = time.monotonic()
        deadline, floor = started + self._grace, started + self._drain_floor_s

        def busy() -> bool:
            here = sum(r.in_flight for r in replicas)
            return bool(here or (self._elsewhere is not None and sum(self._elsewhere(r.url) for r in replicas)))

        while (time.monotonic() < floor or busy()) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.2)  # polling a counter the request path owns; no event to wait on

    async def start(self, policy: Policy) -> None:
        await asyncio.gather(*(self.add(name, spec) for name, spec in policy.pools.items()))

    async def apply(self, fresh: LoadedPolicy, accept_interruption: bool = False) -> None:
        """`check` and `reconcile` for a reloaded policy (call before it becomes current, then `retire_unused`).
        Raises `PolicyError` with the problems (every pool stays as it was), or `PolicyNotApplied` for a change
        that can apply later unchanged (a remote pool's new replicas not answering yet)."""
        self.check(fresh)
        try:
            await self.reconcile(fresh.policy, accept_interruption)
        except PoolChangeRefused as exc:
            error = PolicyNotApplied if exc.retryable else PolicyError
            raise error(fresh.source, exc.problems) from exc

    async def reconcile(self, policy: Policy, accept_interruption: bool = False) -> None:
        """Start the pools `policy` adds and change those whose engines, endpoints or canary it changes (call
        before the new policy becomes current, with no await in between, then `retire_unused`). A change that
        only touches what the gateway reads from the policy itself (price, description, quantization ceiling,
        a canary's weight or guard) restarts nothing. A changed pool goes through `plan_change`, a pool whose
        engine is now its running canary's is promoted (no start), a new or changed canary starts beside its
        pool. Every plan is made, and every new version and canary started, before any pool changes:
        `PoolChangeRefused` (a plan refused, or a new engine that did not start, with its own error) leaves
        every pool as it was."""
        changed = [n for n in self.pools if n in policy.pools and policy.pools[n] != self.specs[n]]
        plans: list[ChangePlan] = []
        refused: list[str] = []
        promoted = [n for n in changed if self._promotes(n, policy.pools[n])]
        for name in changed:
            if name in promoted or _runtime(policy.pools[name]) == _runtime(self.specs[name]):
                continue
            plan = await self._plan(name, policy.pools[name], accept_interruption)
            (refused.append(plan) if isinstance(plan, str) else plans.append(plan))
        if refused:
            raise PoolChangeRefused(refused)
        restarted = {p.pool for p in plans if p.how == "restart"}
        canaries = [n for n in changed if n not in restarted and self._canary_to_start(n, policy.pools[n], promoted)]
        staged, new_canaries = await self._stage([p for p in plans if p.how != "restart"], canaries, policy)
        for plan in plans:
            log.info("pool %s changed: %s, %s", plan.pool, plan.how, plan.why)
            if plan.how == "restart":
                self.remove(plan.pool)
        await asyncio.gather(*(self.add(n, s) for n, s in policy.pools.items() if n not in self.pools))
        for name, new in staged.items():  # no await from here until the caller swaps the policy in
            self._swap(name, policy.pools[name], new)
        for name in promoted:
            self._promote(name, policy.pools[name])
        for name in (n for n in changed if n not in restarted):
            self.specs[name] = policy.pools[name]
            self._settle_canary(name, policy.pools[name], new_canaries.get(name))

    def _promotes(self, name: str, spec: LocalPool | RemotePool) -> bool:
        """Whether `spec` makes the pool's running canary the pool (its engine is the canary's)."""
        route = self.canaries.get(name)
        return route is not None and isinstance(spec, LocalPool) and engine_version(spec.engine) == route.version

    def _canary_to_start(self, name: str, spec: LocalPool | RemotePool, promoted: list[str]) -> bool:
        """Whether `spec` asks for a canary of `name` that is not running (nor rolled back by its guard, nor
        starting with the pool)."""
        if not isinstance(spec, LocalPool) or spec.canary is None:
            return False
        version = engine_version(spec.canary.engine)
        route = None if name in promoted else self.canaries.get(name)
        if route is not None and route.version == version:
            return False
        return self.rolled_back.get(name, ("", ""))[0] != version and self._starting_canary.get(name) != version

    def _settle_canary(self, name: str, spec: LocalPool | RemotePool, started: _StartedCanary | None) -> None:
        """Make the canary of `name` what `spec` says: the one just started, the running one with its new weight
        and guard, or none (the running one drains)."""
        canary = spec.canary if isinstance(spec, LocalPool) else None
        route = self.canaries.get(name)
        if started is not None:
            self._install_canary(name, *started)
        elif canary is None:
            self.rolled_back.pop(name, None)
            if route is not None:
                log.info("pool %s: canary %s removed by the policy", name, route.version)
                self._drop_canary(name)
        elif route is not None and route.version == engine_version(canary.engine):
            if (route.weight, route.guard) != (canary.weight, canary.guard):
                log.info("pool %s: canary %s now takes %.1f%% of its requests", name, route.version,
                         canary.weight * 100)
            self.canaries[name] = replace(route, weight=canary.weight, guard=canary.guard)

    def _promote(self, name: str, spec: LocalPool | RemotePool) -> None:
        """Make the running canary of `name` the pool; the old version drains, then stops."""
        route, sup = self.canaries.pop(name), self._canary_sups.pop(name, None)
        self.guard.forget(name)
        old_pool, old_sup = self.pools[name], self.supervisors.pop(name, None)
        self.pools[name], self.specs[name] = route.pool, spec
        if sup is not None:
            self.supervisors[name] = sup
        self.status[name] = f"ready (version {route.version}, promoted from its canary; the old version drains)"
        log.info("pool %s: canary %s promoted; the old version %s drains", name, route.version, old_pool.version)
        self._spawn(self._retire(f"{name} (version {old_pool.version})", old_pool, old_sup), f"retire:{name}")

    async def _plan(self, name: str, spec: LocalPool | RemotePool, accept_interruption: bool) -> ChangePlan | str:
        runs = isinstance(spec, LocalPool) and self._settings.start_engines
        sup = self.supervisors.get(name)
        serving = bool(sup.ready_urls) if sup is not None else self.pools[name].ready  # a remote one: answering
        room = None
        if runs and serving and isinstance(spec, LocalPool):
            model_dir = Path(resolve_model(spec.engine, models_root(self._settings.home)))
            room = await asyncio.to_thread(judge_room, spec.engine, model_dir)  # reads files, may run nvidia-smi
        old = self.specs[name]
        same_name = isinstance(old, LocalPool) and isinstance(spec, LocalPool) and (
            old.engine.served_name == spec.engine.served_name)
        return plan_change(name, runs_engines=runs, serving=serving, replicas=_replicas(spec), room=room,
                           last_start_s=self.start_took.get(name), accept_interruption=accept_interruption,
                           old_replicas=len(sup.replicas) if sup is not None else 0, same_name=same_name)

    async def _stage(self, plans: list[ChangePlan], canaries: list[str],
                     policy: Policy) -> tuple[dict[str, _NewVersion], dict[str, _StartedCanary]]:
        """Start every new version beside the old one, and every new canary beside its pool; all of them, or
        (raising) none of them."""
        async def stage(plan: ChangePlan) -> _NewVersion:
            spec = policy.pools[plan.pool]
            if plan.how == "replace":
                return _NewVersion(await self._new_pool(plan.pool, spec), None)
            if plan.how == "rolling":
                return await self._roll(plan.pool, _local(spec), plan.step)
            assert isinstance(spec, LocalPool)
            old = self.supervisors.get(plan.pool)
            # the pool's own engines are replaced in the same `Pool`; a remote pool that becomes local gets one
            pool = self.pools[plan.pool] if old is not None else self._pool(plan.pool, spec)
            sup = self._supervisor(plan.pool, spec, pool, beside=old)
            self.status[plan.pool] = "serving; its new version is starting beside it (blue-green)"
            started = time.monotonic()
            await sup.start()  # stops what it started if it fails
            self.start_took[plan.pool] = time.monotonic() - started
            if old is not None:
                return _NewVersion(None, sup)
            pool.set_urls(sup.urls, ready=True)
            return _NewVersion(pool, sup)

        results = await asyncio.gather(*(stage(p) for p in plans), return_exceptions=True)
        canary_results = await asyncio.gather(*(self._start_canary(n, _local(policy.pools[n])) for n in canaries),
                                              return_exceptions=True)
        staged = {p.pool: r for p, r in zip(plans, results, strict=True) if not isinstance(r, BaseException)}
        started = {n: r for n, r in zip(canaries, canary_results, strict=True) if not isinstance(r, BaseException)}
        failed = [(p.pool, "the new version did not start, the old one keeps serving", r)
                  for p, r in zip(plans, results, strict=True) if isinstance(r, BaseException)]
        failed += [(n, "its canary did not start, nothing changed", r)
                   for n, r in zip(canaries, canary_results, strict=True) if isinstance(r, BaseException)]
        if not failed:
            return staged, started
        for new in staged.values():
            await new.aclose()
        for route, sup in started.values():
            await _close(route.pool, sup)
        for name, _, _ in failed:
            self.status[name] = "serving; its new version or canary failed to start (see the reload's error)"
        if any(not isinstance(r, (EngineStartError, OSError)) for _, _, r in failed):
            raise next(r for _, _, r in failed if not isinstance(r, (EngineStartError, OSError)))
        raise PoolChangeRefused([f"pool {name}: {what}: {r}" for name, what, r in failed],
                                retryable=all(isinstance(r, NotAnsweringYet) for _, _, r in failed))

    async def _new_pool(self, name: str, spec: LocalPool | RemotePool) -> Pool:
        """The new replica set, probed until as many of its replicas answer as the old set has answering (or all
        of it, if fewer; at most `REPLACE_WAIT_S`) while the old set serves: a reload never swaps a serving pool
        for one that answers nothing, nor for less capacity. Raises `NotAnsweringYet` when they did not answer
        in time (the old set keeps serving; the policy watcher tries again)."""
        pool, old = self._pool(name, spec), self.pools[name]
        deadline = time.monotonic() + REPLACE_WAIT_S

        def enough() -> bool:
            wanted = min(len(pool.replicas), sum(r.healthy for r in old.replicas))
            return pool.ready and sum(r.healthy for r in pool.replicas) >= wanted

        await pool.probe_once()
        while not enough() and old.ready:
            if time.monotonic() > deadline:
                await pool.aclose()
                answering = sum(r.healthy for r in pool.replicas)
                urls = ", ".join(r.url for r in pool.replicas)
                raise NotAnsweringYet(f"{answering} of the new set's replicas ({urls}) answered their health check "
                                      f"within {REPLACE_WAIT_S:.0f} s, fewer than the old set's "
                                      f"{sum(r.healthy for r in old.replicas)}")
            await asyncio.sleep(min(1.0, self._settings.probe_interval_s))
            await pool.probe_once()
        return pool

    def _swap(self, name: str, spec: LocalPool | RemotePool, new: _NewVersion) -> None:
        """Send the pool's new requests to its new version; the old one drains in the background."""
        old_pool, old_sup = self.pools[name], self.supervisors.pop(name, None)
        self.specs[name] = spec
        if new.sup is not None:
            self.supervisors[name] = new.sup
            self.status[name] = (f"ready (version {new.sup.generation}, started beside the old one in "
                                 f"{self.start_took.get(name, 0):.0f} s; the old one drains)")
        else:
            self.status[name] = "remote" if isinstance(spec, RemotePool) else "external"
        if new.pool is not None:  # a new replica set in a new `Pool`: the old `Pool` drains whole
            new.pool.start()
            self.pools[name] = new.pool
            if isinstance(spec, LocalPool) and self._registry is not None:
                self._spawn(self._follow(name, new.pool), f"follow:{name}")
            self._spawn(self._retire(name, old_pool, old_sup), f"retire:{name}")
            return
        assert new.sup is not None
        draining = [r for r in old_pool.replicas if r.url not in set(new.sup.urls)]
        old_pool.set_urls(new.sup.urls, ready=True)
        old_pool.version = pool_version(spec)  # the supervisor saw every new replica answer /health
        self._spawn(self._drain_version(name, draining, old_sup), f"drain:{name}")

    async def _roll(self, name: str, spec: LocalPool, step: int) -> _NewVersion:
        """Replace the pool's replicas `step` at a time while it serves from both versions: `step` new ones start
        beside the old, take traffic, then as many old ones drain and stop, until the new version has all of
        `spec`'s replicas (`/readyz` says how far it is). Returns the new version, to swap in. A new replica that
        does not start puts the old version back as it was (as many old replicas as were stopped start again)
        and raises its error."""
        old_sup, pool = self.supervisors[name], self.pools[name]
        target = spec.engine.replicas
        first = spec.model_copy(update={"engine": spec.engine.model_copy(update={"replicas": step})})
        sup = self._supervisor(name, first, pool, beside=old_sup)
        say = f"rolling: replacing {step} replica(s) at a time (room for {step} beside the old ones)"
        self.status[name] = f"serving; {say}"
        log.info("pool %s: %s", name, say)
        self._rolling.add(name)
        stopped = 0
        try:
            await sup.start()  # stops what it started if it fails: nothing changed yet
            while True:
                pool.set_urls([*old_sup.urls, *sup.urls], ready=True)
                self.status[name] = f"serving; rolling: {len(sup.replicas)} of {target} replicas on the new version"
                if len(sup.replicas) >= target:
                    return _NewVersion(None, sup)
                batch = sorted(old_sup.replicas, key=lambda r: -r.index)[:min(step, target - len(sup.replicas))]
                for replica in batch:
                    old_sup.detach(replica)
                draining = [r for r in pool.replicas if r.url in {b.url for b in batch}]
                pool.set_urls([*old_sup.urls, *sup.urls], ready=True)
                await self._drained(draining)
                for replica in batch:
                    await old_sup.stop(replica)
                    stopped += 1
                for _ in batch:  # placed like the first new ones (the spec's worker bind), held likewise
                    await sup.add_replica(start_on=sup.start_on)
        except BaseException:
            await self._unroll(name, pool, old_sup, sup, stopped)
            raise
        finally:
            self._rolling.discard(name)

    async def _unroll(self, name: str, pool: Pool, old_sup: EngineSupervisor, sup: EngineSupervisor,
                      stopped: int) -> None:
        """Put the old version back after a rolling change failed: its stopped replicas start again (while what
        runs serves), then the new replicas drain and stop."""
        self.status[name] = "serving; its rolling change failed, the old version's replicas start again"
        log.error("pool %s: rolling change failed after %d replica(s); restoring the old version", name, stopped)
        try:
            for _ in range(stopped):
                await old_sup.add_replica(start_on=old_sup.start_on)
        finally:
            new_urls = set(sup.urls)
            pool.set_urls(old_sup.urls, ready=True)
            draining = [r for r in pool.replicas if r.url in new_urls]
            self._spawn(self._drain_version(name, draining, sup), f"unroll:{name}")

    async def _drain_version(self, name: str, replicas: list[Replica], sup: EngineSupervisor | None) -> None:
        try:
            await self._drained(replicas)
        finally:  # also when shutdown cancels the wait: the old engines must not outlive the gateway
            if sup is not None:
                await sup.aclose()
        log.info("pool %s: the old version's engines stopped", name)

    def retire_unused(self, policy: Policy) -> None:
        """Stop the pools `policy` no longer has (call once it is current: requests deciding on the old
        policy found their pool until then)."""
        for name in [n for n in self.pools if n not in policy.pools]:
            self.remove(name)

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for pool in [*self.pools.values(), *(c.pool for c in self.canaries.values())]:
            await pool.aclose()
        for sup in [*self.supervisors.values(), *self._canary_sups.values()]:
            await sup.aclose()


@dataclass(frozen=True, slots=True)
class _NewVersion:
    """A pool's new version, started and not serving yet: a new replica set (`pool`), new engines (`sup`), or
    both (a remote pool that becomes local)."""

    pool: Pool | None
    sup: EngineSupervisor | None

    async def aclose(self) -> None:
        if self.pool is not None:
            await self.pool.aclose()
        if self.sup is not None:
            await self.sup.aclose()


_StartedCanary = tuple[CanaryRoute, EngineSupervisor | None]


class NotAnsweringYet(EngineStartError):
    """A remote pool's new replicas did not answer within `REPLACE_WAIT_S` (their pods may still be starting)."""


async def _close(pool: Pool, sup: EngineSupervisor | None) -> None:
    await pool.aclose()
    if sup is not None:
        await sup.aclose()


def _local(spec: LocalPool | RemotePool) -> LocalPool:
    assert isinstance(spec, LocalPool)
    return spec


def _bind_beside(spec: LocalPool, others: EngineSupervisor) -> str | None:
    """A `VLLM_CPU_OMP_THREADS_BIND` keeping a new engine's worker off the cores of `others`' workers on a CPU host
    (`cores_beside`), or None where the policy binds the workers itself or no core is free of them."""
    if "VLLM_CPU_OMP_THREADS_BIND" in spec.engine.env:
        return None
    return cores_beside(tuple(r.pid for r in others.replicas if r.pid is not None))


def _beside(spec: LocalPool, old: EngineSupervisor) -> tuple[LocalPool, frozenset[int] | None]:
    """`spec`, its workers kept off the cores of the version it starts beside on a CPU host (`cores_beside`), and
    the cores its processes are held on while it starts (`hold_engine`); `spec` as it is (None) where the policy
    binds the workers itself or no core is free of the old version's workers."""
    bind = _bind_beside(spec, old)
    if bind is None:
        return spec, None
    log.info("pool %s: the new version's workers run on cores %s, beside the old version's", old.pool, bind)
    engine = spec.engine.model_copy(update={"env": {**spec.engine.env, "VLLM_CPU_OMP_THREADS_BIND": bind}})
    return spec.model_copy(update={"engine": engine}), parse_cpus(bind)


def _replicas(spec: LocalPool | RemotePool) -> int:
    return spec.engine.replicas if isinstance(spec, LocalPool) else len(spec.urls)


def _runtime(spec: LocalPool | RemotePool) -> dict[str, object]:
    """What the pool's engines and replicas are built from (not its price or description)."""
    return spec.model_dump(exclude={"price", "description", "max_quant_loss", "canary"})


def _last_answer(pool: Pool) -> Answered:
    """When the gateway last got an answer to a request from the replica at a URL (its breaker's record, in
    monotonic seconds), so that the supervisor does not take a busy engine that answers /health late for hung."""
    def answered(url: str) -> float | None:
        return next((r.breaker.last_success for r in pool.replicas if r.url == url.rstrip("/")), None)

    return answered
