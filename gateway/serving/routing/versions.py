"""Which engine version of its pool a routed request goes to: the pool's own, or the share its canary takes
(`gateway.control.fleet.canaries`). HTTP-free and synchronous: the version is chosen and its `Pool` taken in one
event-loop step, so a swap never splits a request between two versions."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from backends.clients.pool import Pool
from gateway.control.fleet.canaries import CanaryRoute, sticky_key, takes_canary
from gateway.errors import NoReplicaAvailable
from policies.decide import RouteDecision

__all__ = ["PoolVersions"]


class PoolVersions:
    """Reads, does not own, the pools and canaries of `gateway.control.fleet.pool_set.PoolSet`."""

    def __init__(self, pools: Mapping[str, Pool], canaries: Mapping[str, CanaryRoute]) -> None:
        self._pools = pools
        self._canaries = canaries

    def target(self, decision: RouteDecision, raw: Mapping[str, Any]) -> tuple[RouteDecision, Pool]:
        """`decision` with the engine version that serves it (and that version's model name), and its replicas.
        A canary takes its weight of the pool's requests while one of its replicas is ready. Raises
        `NoReplicaAvailable` for a pool that is not running."""
        canary = self._canaries.get(decision.pool)
        if canary is not None and canary.pool.ready and takes_canary(decision.pool, sticky_key(raw), canary.weight):
            why = f"version {canary.version} takes {canary.weight:.0%} of the pool's requests"
            return decision.then("canary", why, model=canary.model, pool_version=canary.version), canary.pool
        return self.own(decision)

    def pool(self, name: str) -> Pool | None:
        """The own version of pool `name` (its replicas), or None where it is not running."""
        return self._pools.get(name)

    def own(self, decision: RouteDecision) -> tuple[RouteDecision, Pool]:
        """`decision` (as routed, before `target`: its model is the pool's own) on the pool's own version."""
        pool = self._pools.get(decision.pool)
        if pool is None:
            raise NoReplicaAvailable(f"pool {decision.pool!r} has no running replicas")
        return replace(decision, pool_version=pool.version), pool

    def on_canary(self, decision: RouteDecision, pool: Pool) -> bool:
        """Whether `pool` (from `target`) is not the pool's own version now: a canary, also one rolled back since."""
        return self._pools.get(decision.pool) is not pool
