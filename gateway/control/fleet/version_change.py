"""A pool's new engine version, started beside the old one: blue-green and rolling changes (`PoolSet.reconcile`).

The plan comes from `gateway.control.fleet.pool_change.plan_change` (what the machine has room for). Then, before any
pool changes, every new version is staged: a new replica set (a remote pool's, `REPLACE_WAIT_S` to answer), new
engines beside the old ones (blue-green, off their cores on a CPU host), or the replicas replaced a few at a time
while the pool serves from both versions (rolling). All of them start, or none: a failure leaves every pool as it
was. Staged versions are then swapped in with no await in between, and the old version drains and stops.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from backends.clients.pool import Pool
from backends.engines.args import resolve_model
from backends.engines.cpu_pinning import parse_cpus
from backends.engines.room import judge_room
from backends.engines.supervisor import EngineStartError, EngineSupervisor
from backends.models.demo import models_root
from gateway.control.fleet.canary_set import StartedCanary
from gateway.control.fleet.draining import Drainer, close
from gateway.control.fleet.pool_change import ChangePlan, PoolChangeRefused, plan_change
from gateway.control.fleet.replica_scaling import bind_beside
from gateway.settings import Settings
from policies.pools import pool_version
from policies.schema import LocalPool, Policy, RemotePool

__all__ = ["REPLACE_WAIT_S", "NewVersion", "NotAnsweringYet", "PoolHost", "VersionChange", "local", "placed_beside"]

log = logging.getLogger("cascade.pools")

REPLACE_WAIT_S = 30.0
"""How long a reload waits for a serving remote pool's new replica set to answer before it refuses the change."""


@dataclass(frozen=True, slots=True)
class NewVersion:
    """A pool's new version, started and not serving yet: a new replica set (`pool`), new engines (`sup`), or
    both (a remote pool that becomes local)."""

    pool: Pool | None
    sup: EngineSupervisor | None

    async def aclose(self) -> None:
        if self.pool is not None:
            await self.pool.aclose()
        if self.sup is not None:
            await self.sup.aclose()


class NotAnsweringYet(EngineStartError):
    """A remote pool's new replicas did not answer within `REPLACE_WAIT_S` (their pods may still be starting)."""


class PoolHost(Protocol):
    """What a version change reads and changes of the pool set it works for
    (`gateway.control.fleet.pool_set.PoolSet`)."""

    pools: dict[str, Pool]
    specs: dict[str, LocalPool | RemotePool]
    supervisors: dict[str, EngineSupervisor]
    status: dict[str, str]
    start_took: dict[str, float]

    def build_pool(self, name: str, spec: LocalPool | RemotePool, urls: list[str] | None = None) -> Pool: ...

    def supervisor_for(self, name: str, spec: LocalPool, pool: Pool, beside: EngineSupervisor | None = None
                       ) -> EngineSupervisor: ...

    async def start_canary(self, name: str, spec: LocalPool) -> StartedCanary: ...

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None: ...

    def follow_published(self, name: str, pool: Pool) -> None: ...

    def retire_later(self, name: str, pool: Pool, sup: EngineSupervisor | None) -> None: ...


class VersionChange:
    """Plans, stages and swaps in the new versions of a pool set's pools: it reads and changes the set's `pools`,
    `specs`, `supervisors`, `status` and `start_took`, and builds pools and supervisors with the set's own
    factories (`PoolHost`). `rolling`: the pools whose replicas it is replacing a few at a time (their
    supervisors' port moves are not followed: it sets those pools' replicas itself)."""

    def __init__(self, pools: PoolHost, settings: Settings, drainer: Drainer) -> None:
        self._set = pools
        self._settings = settings
        self._drainer = drainer
        self.rolling: set[str] = set()

    async def plan(self, name: str, spec: LocalPool | RemotePool, accept_interruption: bool) -> ChangePlan | str:
        ps = self._set
        runs = isinstance(spec, LocalPool) and self._settings.start_engines
        sup = ps.supervisors.get(name)
        serving = bool(sup.ready_urls) if sup is not None else ps.pools[name].ready  # a remote one: answering
        room = None
        if runs and serving and isinstance(spec, LocalPool):
            model_dir = Path(resolve_model(spec.engine, models_root(self._settings.home)))
            room = await asyncio.to_thread(judge_room, spec.engine, model_dir)  # reads files, may run nvidia-smi
        old = ps.specs[name]
        same_name = isinstance(old, LocalPool) and isinstance(spec, LocalPool) and (
            old.engine.served_name == spec.engine.served_name)
        return plan_change(name, runs_engines=runs, serving=serving, replicas=_replicas(spec), room=room,
                           last_start_s=ps.start_took.get(name), accept_interruption=accept_interruption,
                           old_replicas=len(sup.replicas) if sup is not None else 0, same_name=same_name)

    async def _stage_one(self, plan: ChangePlan, policy: Policy) -> NewVersion:
        ps, spec = self._set, policy.pools[plan.pool]
        if plan.how == "replace":
            return NewVersion(await self._new_pool(plan.pool, spec), None)
        if plan.how == "rolling":
            return await self._roll(plan.pool, local(spec), plan.step)
        assert isinstance(spec, LocalPool)
        old = ps.supervisors.get(plan.pool)
        # the pool's own engines are replaced in the same `Pool`; a remote pool that becomes local gets one
        pool = ps.pools[plan.pool] if old is not None else ps.build_pool(plan.pool, spec)
        sup = ps.supervisor_for(plan.pool, spec, pool, beside=old)
        ps.status[plan.pool] = "serving; its new version is starting beside it (blue-green)"
        started = time.monotonic()
        await sup.start()  # stops what it started if it fails
        ps.start_took[plan.pool] = time.monotonic() - started
        if old is not None:
            return NewVersion(None, sup)
        pool.set_urls(sup.urls, ready=True)
        return NewVersion(pool, sup)

    async def stage(self, plans: list[ChangePlan], canaries: list[str],
                    policy: Policy) -> tuple[dict[str, NewVersion], dict[str, StartedCanary]]:
        """Start every new version beside the old one, and every new canary beside its pool; all of them, or
        (raising `PoolChangeRefused`, or the first error that is not a start's) none of them."""
        ps = self._set
        results = await asyncio.gather(*(self._stage_one(p, policy) for p in plans), return_exceptions=True)
        canary_results = await asyncio.gather(*(ps.start_canary(n, local(policy.pools[n])) for n in canaries),
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
            await close(route.pool, sup)
        for name, _, _ in failed:
            ps.status[name] = "serving; its new version or canary failed to start (see the reload's error)"
        if any(not isinstance(r, (EngineStartError, OSError)) for _, _, r in failed):
            raise next(r for _, _, r in failed if not isinstance(r, (EngineStartError, OSError)))
        raise PoolChangeRefused([f"pool {name}: {what}: {r}" for name, what, r in failed],
                                retryable=all(isinstance(r, NotAnsweringYet) for _, _, r in failed))

    async def _new_pool(self, name: str, spec: LocalPool | RemotePool) -> Pool:
        """The new replica set, probed until as many of its replicas answer as the old set has answering (or all
        of it, if fewer; at most `REPLACE_WAIT_S`) while the old set serves: a reload never swaps a serving pool
        for one that answers nothing, nor for less capacity. Raises `NotAnsweringYet` when they did not answer
        in time (the old set keeps serving; the policy watcher tries again)."""
        pool, old = self._set.build_pool(name, spec), self._set.pools[name]
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

    def swap(self, name: str, spec: LocalPool | RemotePool, new: NewVersion) -> None:
        """Send the pool's new requests to its new version; the old one drains in the background."""
        ps = self._set
        old_pool, old_sup = ps.pools[name], ps.supervisors.pop(name, None)
        ps.specs[name] = spec
        if new.sup is not None:
            ps.supervisors[name] = new.sup
            ps.status[name] = (f"ready (version {new.sup.generation}, started beside the old one in "
                               f"{ps.start_took.get(name, 0):.0f} s; the old one drains)")
        else:
            ps.status[name] = "remote" if isinstance(spec, RemotePool) else "external"
        if new.pool is not None:  # a new replica set in a new `Pool`: the old `Pool` drains whole
            new.pool.start()
            ps.pools[name] = new.pool
            if isinstance(spec, LocalPool):
                ps.follow_published(name, new.pool)
            ps.retire_later(name, old_pool, old_sup)
            return
        assert new.sup is not None
        draining = [r for r in old_pool.replicas if r.url not in set(new.sup.urls)]
        old_pool.set_urls(new.sup.urls, ready=True)
        old_pool.version = pool_version(spec)  # the supervisor saw every new replica answer /health
        ps.spawn(self._drainer.drain_version(name, draining, old_sup), f"drain:{name}")

    async def _roll(self, name: str, spec: LocalPool, step: int) -> NewVersion:
        """Replace the pool's replicas `step` at a time while it serves from both versions: `step` new ones start
        beside the old, take traffic, then as many old ones drain and stop, until the new version has all of
        `spec`'s replicas (`/readyz` says how far it is). Returns the new version, to swap in. A new replica that
        does not start puts the old version back as it was (as many old replicas as were stopped start again)
        and raises its error."""
        ps = self._set
        old_sup, pool = ps.supervisors[name], ps.pools[name]
        target = spec.engine.replicas
        first = spec.model_copy(update={"engine": spec.engine.model_copy(update={"replicas": step})})
        sup = ps.supervisor_for(name, first, pool, beside=old_sup)
        say = f"rolling: replacing {step} replica(s) at a time (room for {step} beside the old ones)"
        ps.status[name] = f"serving; {say}"
        log.info("pool %s: %s", name, say)
        self.rolling.add(name)
        stopped = 0
        try:
            await sup.start()  # stops what it started if it fails: nothing changed yet
            while True:
                pool.set_urls([*old_sup.urls, *sup.urls], ready=True)
                ps.status[name] = f"serving; rolling: {len(sup.replicas)} of {target} replicas on the new version"
                if len(sup.replicas) >= target:
                    return NewVersion(None, sup)
                batch = sorted(old_sup.replicas, key=lambda r: -r.index)[:min(step, target - len(sup.replicas))]
                for replica in batch:
                    old_sup.detach(replica)
                draining = [r for r in pool.replicas if r.url in {b.url for b in batch}]
                pool.set_urls([*old_sup.urls, *sup.urls], ready=True)
                await self._drainer.drained(draining)
                for replica in batch:
                    await old_sup.stop(replica)
                    stopped += 1
                for _ in batch:  # placed like the first new ones (the spec's worker bind), held likewise
                    await sup.add_replica(start_on=sup.start_on)
        except BaseException:
            await self._unroll(name, pool, old_sup, sup, stopped)
            raise
        finally:
            self.rolling.discard(name)

    async def _unroll(self, name: str, pool: Pool, old_sup: EngineSupervisor, sup: EngineSupervisor,
                      stopped: int) -> None:
        """Put the old version back after a rolling change failed: its stopped replicas start again (while what
        runs serves), then the new replicas drain and stop."""
        self._set.status[name] = "serving; its rolling change failed, the old version's replicas start again"
        log.error("pool %s: rolling change failed after %d replica(s); restoring the old version", name, stopped)
        try:
            for _ in range(stopped):
                await old_sup.add_replica(start_on=old_sup.start_on)
        finally:
            new_urls = set(sup.urls)
            pool.set_urls(old_sup.urls, ready=True)
            draining = [r for r in pool.replicas if r.url in new_urls]
            self._set.spawn(self._drainer.drain_version(name, draining, sup), f"unroll:{name}")


def local(spec: LocalPool | RemotePool) -> LocalPool:
    assert isinstance(spec, LocalPool)
    return spec


def placed_beside(spec: LocalPool, old: EngineSupervisor) -> tuple[LocalPool, frozenset[int] | None]:
    """`spec`, its workers kept off the cores of the version it starts beside on a CPU host (`cores_beside`), and
    the cores its processes are held on while it starts (`hold_engine`); `spec` as it is (None) where the policy
    binds the workers itself or no core is free of the old version's workers."""
    bind = bind_beside(spec, old)
    if bind is None:
        return spec, None
    log.info("pool %s: the new version's workers run on cores %s, beside the old version's", old.pool, bind)
    engine = spec.engine.model_copy(update={"env": {**spec.engine.env, "VLLM_CPU_OMP_THREADS_BIND": bind}})
    return spec.model_copy(update={"engine": engine}), parse_cpus(bind)


def _replicas(spec: LocalPool | RemotePool) -> int:
    return spec.engine.replicas if isinstance(spec, LocalPool) else len(spec.urls)
