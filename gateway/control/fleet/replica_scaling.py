"""One replica more or less for a running local pool: what the autoscaler's changes do
(`gateway.control.fleet.autoscale`).

Up: the machine's room is judged first (memory for the KV cache, weights and processes, or free GPU memory); the new
replica starts beside the others, off their cores on a CPU host, and takes requests once it answers. Down: the
newest replica leaves routing, its requests finish (streams included, bounded by the drain's grace), then it stops.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from backends.clients.pool import Pool
from backends.engines.args import resolve_model
from backends.engines.cpu_pinning import cores_beside, parse_cpus
from backends.engines.room import NoRoom, judge_room
from backends.engines.supervisor import EngineSupervisor
from backends.models.demo import models_root
from gateway.control.fleet.draining import Drainer
from policies.schema import LocalPool

__all__ = ["add_replica", "bind_beside", "remove_replica"]


def bind_beside(spec: LocalPool, others: EngineSupervisor) -> str | None:
    """A `VLLM_CPU_OMP_THREADS_BIND` keeping a new engine's worker off the cores of `others`' workers on a CPU host
    (`cores_beside`), or None where the policy binds the workers itself or no core is free of them."""
    if "VLLM_CPU_OMP_THREADS_BIND" in spec.engine.env:
        return None
    return cores_beside(tuple(r.pid for r in others.replicas if r.pid is not None))


async def add_replica(home: Path, spec: LocalPool, sup: EngineSupervisor, pool: Pool,
                      serving: Callable[[], bool]) -> int:
    """Start one more replica of `spec` under `sup` and, while `serving()` (the pool still is `pool` and `sup`),
    route `pool` to it; returns the replicas now. Raises `NoRoom`, or what the supervisor's start raised (the pool
    keeps its replicas)."""
    model_dir = Path(resolve_model(spec.engine, models_root(home)))
    room = await asyncio.to_thread(judge_room, spec.engine.model_copy(update={"replicas": 1}), model_dir)
    if room.fits < 1:
        raise NoRoom(room.how)
    bind = bind_beside(spec, sup)
    env = {} if bind is None else {"VLLM_CPU_OMP_THREADS_BIND": bind}
    await sup.add_replica(env, None if bind is None else parse_cpus(bind))
    if serving():
        pool.set_urls(sup.urls, ready=True)
        await pool.probe_once()
    return len(sup.replicas)


async def remove_replica(sup: EngineSupervisor, pool: Pool, drainer: Drainer) -> int:
    """Take the newest replica of `sup` out of `pool`'s routing, let its requests finish, then stop it; returns the
    replicas now."""
    replica = max(sup.replicas, key=lambda r: r.index)
    draining = [r for r in pool.replicas if r.url == replica.url]
    sup.detach(replica)  # the pool follows the supervisor's URLs: no new request reaches it
    try:
        await drainer.drained(draining)
    finally:
        await sup.stop(replica)
    return len(sup.replicas)
