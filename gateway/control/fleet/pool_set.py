"""The running pools of a policy: built at start, reconciled on every policy reload.

Local pools' engines start in the background (/healthz and /readyz answer, with progress, while engines load). On
reload, added pools start and removed ones stop once their in-flight requests are done (bounded by a grace period):
requests in flight keep the `Pool` they started with. A pool whose engines change does not go dark where it can be
helped (`gateway.control.fleet.pool_change`): new engines start beside the old, take traffic once ready, and the old
drain and stop; a replica that restarts on another port is followed there. It owns the pools and composes the concerns
of changing them, each a module of its own: new engine versions (`version_change`), canaries (`canary_set`), one replica
more or less (`replica_scaling`) and draining what leaves routing (`draining`). A reload reads from `apply` down.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import replace
from pathlib import Path
from typing import Any

from backends.background import cancel_once, close_each
from backends.clients.pool import Pool, ProbeErrorHook
from backends.clients.shared import EngineClient
from backends.engines.registry import published
from backends.engines.supervisor import EngineSupervisor, RestartHook
from backends.engines.supervisor import Replica as EngineReplica
from backends.machine_checks import checked_here
from gateway.control.fleet.canaries import CanaryGuard, CanaryRoute
from gateway.control.fleet.canary_set import CanarySet, StartedCanary
from gateway.control.fleet.draining import Drainer, close
from gateway.control.fleet.pool_build import PoolBuilder, choice_weights, last_answer
from gateway.control.fleet.pool_change import ChangePlan, PolicyNotApplied, PoolChangeRefused
from gateway.control.fleet.replica_scaling import add_replica, remove_replica
from gateway.control.fleet.version_change import VersionChange, local, placed_beside
from gateway.settings import Settings
from policies.loader import LoadedPolicy, PolicyError
from policies.parallelism import OnDemand
from policies.pools import engine_version
from policies.schema import LocalPool, Policy, RemotePool

__all__ = ["PoolSet"]

log = logging.getLogger("cascade.pools")


class PoolSet:
    """Owns the pools (a dict shared with the service), their supervisors and the background tasks."""

    def __init__(self, settings: Settings, client: EngineClient, progress: Callable[[str], None] | None = None,
                 drain_grace_s: float = 60.0, elsewhere: Callable[[str, float], int] | None = None,
                 drain_floor_s: float = 0.0, traces_to: str | None = None,
                 supervisor: Callable[..., EngineSupervisor] | None = None) -> None:
        """`elsewhere(url, since)`: what other processes hold of the replica at `url` (the workers of `--workers N`,
        for the parent that runs their engines and serves nothing itself: their requests in flight to it, and the
        workers that have not shown since `since` that they stopped routing to it, `draining.Drainer`); a replica
        drains until that is 0 too, and not before `drain_floor_s`.
        `supervisor`: how engine supervisors are made (default `EngineSupervisor`); `traces_to`: where local engines
        export their own spans (`backends.engines.args.otlp_traces_endpoint`; None: they do not)."""
        self._traces_to = traces_to
        self._drainer = Drainer(drain_grace_s, drain_floor_s, elsewhere)
        self._make_supervisor = supervisor
        self._settings = settings
        self._client = client
        self._progress = progress
        self.pools: dict[str, Pool] = {}
        self.specs: dict[str, LocalPool | RemotePool] = {}
        self.supervisors: dict[str, EngineSupervisor] = {}
        self.status: dict[str, str] = {}
        self.on_engine_restart: RestartHook | None = None  # (pool, replica index, "exited" | "hung"): metrics
        self.start_took: dict[str, float] = {}  # seconds the pool's engines took to start, the last time
        self.builder = PoolBuilder(settings, client)
        self._registry = self.builder.registry  # the `--workers N` parent's published ports, in a worker
        self._tasks: set[asyncio.Task[None]] = set()
        self._canaries = CanarySet(self.retire_later)
        self.canaries: dict[str, CanaryRoute] = self._canaries.routes  # read by the request path
        self.guard: CanaryGuard = self._canaries.guard
        self._generations: dict[str, int] = {}
        self._versions = VersionChange(self, settings, self._drainer)

    @staticmethod
    def check(loaded: LoadedPolicy) -> None:
        """Refuse a policy whose pools cannot run on this machine as written (a quantized checkpoint over its
        `max_quant_loss` ceiling, an unusable TLS file). Call before `start` or `reconcile`; raises
        `PolicyError` with file:line."""
        checked_here(loaded)

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        """Run `coro` as a task this set owns (cancelled by `aclose`)."""
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

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

    def follow_published(self, name: str, pool: Pool) -> None:
        """Where another process runs the engines (the `--workers N` parent), follow the ports it publishes for
        local pool `name` while `pool` is its pool."""
        if self._registry is not None:
            self.spawn(self._follow(name, pool), f"follow:{name}")

    def retire_later(self, name: str, pool: Pool, sup: EngineSupervisor | None) -> None:
        """Drain `pool` (out of routing already), then stop it and `sup`'s engines, in the background."""
        self.spawn(self._drainer.retire(name, pool, sup), f"retire:{name}")

    def on_probe_error(self, hook: ProbeErrorHook) -> None:
        """Tell `hook` of every pool's probe errors from now on, the pools built already included."""
        self.builder.on_probe_error = hook

    def build_pool(self, name: str, spec: LocalPool | RemotePool, urls: list[str] | None = None) -> Pool:
        """A `Pool` of `spec`'s replicas (`urls`: these instead), not started (`PoolBuilder.build`)."""
        return self.builder.build(name, spec, urls)

    async def add(self, name: str, spec: LocalPool | RemotePool) -> None:
        pool = self.build_pool(name, spec)
        await pool.probe_once()
        pool.start()
        self.pools[name], self.specs[name] = pool, spec
        self.status[name] = "remote" if isinstance(spec, RemotePool) else "external"
        if isinstance(spec, LocalPool):
            self.follow_published(name, pool)
        if isinstance(spec, LocalPool) and self._settings.start_engines:
            if spec.on_demand is not None:
                self.status[name] = "sleeping (on demand: starts on the first request)"
                return
            self.status[name] = "starting"
            self.spawn(self._start_engines(name, spec, pool), f"engines:{name}")
        elif isinstance(spec, LocalPool) and spec.canary is not None:
            self.spawn(self._start_canary_now(name, spec), f"canary:{name}")

    def _engine_restarted(self, pool: str, index: int, reason: str) -> None:
        if self.on_engine_restart is not None:
            self.on_engine_restart(pool, index, reason)

    @property
    def registry(self) -> Path | None:
        """Where another process (the `--workers N` parent) publishes the local engines' ports, else None."""
        return self._registry

    def on_demand(self, name: str) -> OnDemand | None:
        """Pool `name`'s scale-to-zero settings where this process starts engines or follows one that does."""
        spec = self.specs.get(name)
        here = self._settings.start_engines or self._registry is not None  # a worker of --workers N follows
        return spec.on_demand if isinstance(spec, LocalPool) and here else None

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

    def supervisor_for(self, name: str, spec: LocalPool, pool: Pool, beside: EngineSupervisor | None = None
                       ) -> EngineSupervisor:
        """A supervisor for the pool's engines (a new generation: its own log files) whose port moves `pool`
        follows while it serves, as the pool or as its canary. `beside`: the serving version it starts beside
        (its workers, and its processes while it starts, are kept off that version's cores:
        `gateway.control.fleet.version_change.placed_beside`)."""
        spec, start_on = placed_beside(spec, beside) if beside is not None else (spec, None)
        def moved(urls: tuple[str, ...]) -> None:
            canary = self.canaries.get(name)
            if name in self._versions.rolling:  # a rolling change sets the pool's replicas itself, from both
                return
            if self.pools.get(name) is pool or (canary is not None and canary.pool is pool):
                pool.set_urls(urls)

        generation = self._generations.get(name, -1) + 1
        self._generations[name] = generation
        factory = self._make_supervisor or EngineSupervisor
        sup = factory(name, spec.engine, home=self._settings.home, progress=self._progress,
                               on_restart=self._engine_restarted, answered=last_answer(pool), on_urls=moved,
                               generation=generation, start_on=start_on, traces_to=self._traces_to)
        return sup

    async def _launch(self, name: str, spec: LocalPool, pool: Pool) -> float:
        """Start the pool's engines under a (registered) supervisor, point the pool at them and probe them;
        returns the seconds it took. Raises what the supervisor's start raised."""
        sup = self.supervisor_for(name, spec, pool)
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
        self._canaries.starting[name] = version = engine_version(spec.canary.engine)
        try:
            route, sup = await self.start_canary(name, spec)
        except Exception as exc:
            self.status[name] = self.status.get(name, "") + f"; its canary failed to start: {exc}"
            log.error("canary of pool %s failed to start: %s", name, exc)
            return
        finally:
            self._canaries.starting.pop(name, None)
        current = self.specs.get(name)
        wanted = current.canary if isinstance(current, LocalPool) else None
        if wanted is None or engine_version(wanted.engine) != version or name in self.canaries:
            await close(route.pool, sup)  # a reload meanwhile changed or removed it
            return
        self._canaries.install(name, replace(route, weight=wanted.weight, guard=wanted.guard), sup)

    async def start_canary(self, name: str, spec: LocalPool) -> StartedCanary:
        """Start `spec`'s canary engines (beside the pool's, off their cores on a CPU host) or, where this
        process runs no engines, point at them (`base_port + i`, or the published ports). Raises what the
        supervisor's start raised (it stops what it started)."""
        canary = spec.canary
        assert canary is not None
        as_pool = spec.model_copy(update={"engine": canary.engine, "canary": None})
        version, model = engine_version(canary.engine), canary.engine.served_name
        if not self._settings.start_engines:
            pool = self.build_pool(name, as_pool, self.builder.static_urls(f"{name}.canary", as_pool))
            await pool.probe_once()
            pool.start()
            return CanaryRoute(pool, version, model, canary.weight, canary.guard), None
        pool = self.build_pool(name, as_pool, [])
        stable = self.supervisors.get(name)
        sup = self.supervisor_for(name, as_pool, pool, beside=stable)
        started = time.monotonic()
        await sup.start()
        log.info("pool %s: canary %s started in %.0f s", name, version, time.monotonic() - started)
        pool.set_urls(sup.urls, ready=True)
        pool.start()
        return CanaryRoute(pool, version, model, canary.weight, canary.guard), sup

    def supervisors_of_canary(self, name: str) -> tuple[EngineReplica, ...]:
        """The replicas of the running canary of `name` that this process supervises (none: no canary here)."""
        return self._canaries.replicas_of(name)

    def versions(self) -> dict[str, dict[str, object]]:
        """Per pool, the engine version serving it and its canary (version, model, weight, ready), or the canary
        its guard rolled back and why: /readyz's `versions`."""
        out: dict[str, dict[str, object]] = {}
        for name, pool in self.pools.items():
            entry: dict[str, object] = {"version": pool.version}
            canary = self._canaries.version_entry(name)
            if canary is not None:
                entry["canary"] = canary
            out[name] = entry
        return out

    async def scale_up(self, name: str) -> int:
        """Start one more replica of local pool `name` beside its others and route to it once it answers; returns
        the replicas now. Raises `NoRoom` or what the supervisor's start raised (`replica_scaling.add_replica`)."""
        spec, sup, pool = local(self.specs[name]), self.supervisors[name], self.pools[name]
        return await add_replica(self._settings.home, spec, sup, pool,
                                 lambda: self.pools.get(name) is pool and self.supervisors.get(name) is sup)

    async def scale_down(self, name: str) -> int:
        """Take the newest replica of local pool `name` out of routing, let its requests finish (streams
        included, bounded by the grace period), then stop it; returns the replicas now."""
        return await remove_replica(self.supervisors[name], self.pools[name], self._drainer)

    def remove(self, name: str) -> None:
        """Take the pool (and its canary) out of routing now; stop it once idle (or after the grace period)."""
        self._canaries.forget(name)
        pool = self.pools.pop(name)
        self.specs.pop(name)
        self.status.pop(name, None)
        self.retire_later(name, pool, self.supervisors.pop(name, None))

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
        promoted = [n for n in changed if self._canaries.promotes(n, policy.pools[n])]
        for name in changed:
            if name in promoted or _runtime(policy.pools[name]) == _runtime(self.specs[name]):
                continue
            plan = await self._versions.plan(name, policy.pools[name], accept_interruption)
            (refused.append(plan) if isinstance(plan, str) else plans.append(plan))
        if refused:
            raise PoolChangeRefused(refused)
        restarted = {p.pool for p in plans if p.how == "restart"}
        canaries = [n for n in changed if n not in restarted and self._canaries.to_start(n, policy.pools[n], promoted)]
        staged, new_canaries = await self._versions.stage([p for p in plans if p.how != "restart"], canaries, policy)
        for plan in plans:
            log.info("pool %s changed: %s, %s", plan.pool, plan.how, plan.why)
            if plan.how == "restart":
                self.remove(plan.pool)
        await asyncio.gather(*(self.add(n, s) for n, s in policy.pools.items() if n not in self.pools))
        for name, new in staged.items():  # no await from here until the caller swaps the policy in
            self._versions.swap(name, policy.pools[name], new)
        for name in promoted:
            self._promote(name, policy.pools[name])
        for name in (n for n in changed if n not in restarted):
            self.specs[name] = policy.pools[name]
            self.pools[name].weights = choice_weights(policy.pools[name])  # read per request: no restart
            self._canaries.settle(name, policy.pools[name], new_canaries.get(name))

    def _promote(self, name: str, spec: LocalPool | RemotePool) -> None:
        """Make the running canary of `name` the pool; the old version drains, then stops."""
        route, sup = self._canaries.take(name)
        old_pool, old_sup = self.pools[name], self.supervisors.pop(name, None)
        self.pools[name], self.specs[name] = route.pool, spec
        if sup is not None:
            self.supervisors[name] = sup
        self.status[name] = f"ready (version {route.version}, promoted from its canary; the old version drains)"
        log.info("pool %s: canary %s promoted; the old version %s drains", name, route.version, old_pool.version)
        self.retire_later(f"{name} (version {old_pool.version})", old_pool, old_sup)

    def retire_unused(self, policy: Policy) -> None:
        """Stop the pools `policy` no longer has (call once it is current: requests deciding on the old
        policy found their pool until then)."""
        for name in [n for n in self.pools if n not in policy.pools]:
            self.remove(name)

    async def aclose(self) -> None:
        """Stop the set's tasks (a pool being drained is closed, its engines stopped), then close every pool and
        stop every supervisor's engines, each whatever the others do: a failure is logged with its pool (and the
        supervisor logs each replica it could not stop), never raised."""
        await cancel_once(list(self._tasks), log)  # once: a retiring pool's engines are stopped in its task
        pools = [(f"pool {name}", pool.aclose) for name, pool in self.pools.items()]
        pools += [(f"the canary of pool {name}", c.pool.aclose) for name, c in self.canaries.items()]
        await close_each(pools, log)
        sups = [(f"the engines of pool {name}", sup.aclose) for name, sup in self.supervisors.items()]
        sups += [(f"the engines of a canary of pool {sup.pool}", sup.aclose) for sup in self._canaries.supervisors()]
        await close_each(sups, log)


def _runtime(spec: LocalPool | RemotePool) -> dict[str, object]:
    """What the pool's engines and replicas are built from (not its price or description)."""
    return spec.model_dump(exclude={"price", "description", "max_quant_loss", "canary", "provider",
                                    "replica_choice"})
