"""The canaries of a pool set: which run, which their guard rolled back, and how a reload settles them.

A local pool's canary (`canary:` in the policy) runs as a second engine version beside the pool's own, in a `Pool`
of its own (`routes`, read by the request path: `gateway.serving.routing.versions`). A reload that adds or changes a
canary starts it (the pool set does, `PoolSet.reconcile`) before the reload answers; one that removes it drains and
stops it; one whose pool engine is the running canary's engine (`cascade pool promote`) makes the canary the pool
without starting anything (`take`). A canary its guard rolled back stays stopped until the policy changes or removes it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from backends.clients.pool import Pool
from backends.engines.supervisor import EngineSupervisor
from backends.engines.supervisor import Replica as EngineReplica
from gateway.control.fleet.canaries import CanaryGuard, CanaryRoute
from policies.pools import engine_version
from policies.schema import LocalPool, RemotePool

__all__ = ["CanarySet", "StartedCanary"]

log = logging.getLogger("cascade.pools")

StartedCanary = tuple[CanaryRoute, EngineSupervisor | None]
"""A canary started and not taking requests yet: its route and, where this process runs its engines, their
supervisor."""
Retire = Callable[[str, Pool, EngineSupervisor | None], None]
"""Drain a pool out of routing, then stop it and its engines, in the background (`PoolSet`'s)."""


class CanarySet:
    """Owns the canaries' routes and the supervisors of those this process runs; `retire` stops what leaves."""

    def __init__(self, retire: Retire) -> None:
        self.routes: dict[str, CanaryRoute] = {}
        self.rolled_back: dict[str, tuple[str, str]] = {}  # pool: (canary version, why its guard rolled it back)
        self.starting: dict[str, str] = {}  # pool: version of the canary starting with the pool
        self.guard = CanaryGuard(self.routes, self._tripped)
        self._sups: dict[str, EngineSupervisor] = {}
        self._retire = retire

    def install(self, name: str, route: CanaryRoute, sup: EngineSupervisor | None) -> None:
        """Send the canary its share of the pool's requests from now on (a canary it replaces drains)."""
        self.drop(name)
        self.routes[name] = route
        if sup is not None:
            self._sups[name] = sup
        self.rolled_back.pop(name, None)
        log.info("pool %s: canary %s takes %.1f%% of its requests", name, route.version, route.weight * 100)

    def drop(self, name: str) -> None:
        """Stop sending requests to the canary of `name` (if any); it drains and stops in the background."""
        route, sup = self.routes.pop(name, None), self._sups.pop(name, None)
        self.guard.forget(name)
        if route is not None:
            self._retire(f"{name} (canary {route.version})", route.pool, sup)

    def forget(self, name: str) -> None:
        """The pool `name` leaves: its canary drains, and what its guard rolled back is forgotten."""
        self.drop(name)
        self.rolled_back.pop(name, None)

    def take(self, name: str) -> StartedCanary:
        """The running canary of `name`, no longer a canary: the pool set makes it the pool (`cascade pool
        promote`)."""
        route, sup = self.routes.pop(name), self._sups.pop(name, None)
        self.guard.forget(name)
        return route, sup

    def _tripped(self, name: str, version: str, reason: str) -> None:
        self.rolled_back[name] = (version, reason)
        self.drop(name)

    def replicas_of(self, name: str) -> tuple[EngineReplica, ...]:
        """The replicas of the running canary of `name` that this process supervises (none: no canary here)."""
        sup = self._sups.get(name)
        return sup.replicas if sup is not None else ()

    def supervisors(self) -> list[EngineSupervisor]:
        return list(self._sups.values())

    def version_entry(self, name: str) -> dict[str, object] | None:
        """/readyz's `canary` of pool `name`: the running one (version, model, weight, ready), or the one its guard
        rolled back and why; None without either."""
        route = self.routes.get(name)
        if route is not None:
            return {"version": route.version, "model": route.model, "weight": route.weight,
                    "ready": route.pool.ready}
        if name in self.rolled_back:
            version, reason = self.rolled_back[name]
            return {"version": version, "rolled_back": reason}
        return None

    def promotes(self, name: str, spec: LocalPool | RemotePool) -> bool:
        """Whether `spec` makes the pool's running canary the pool (its engine is the canary's)."""
        route = self.routes.get(name)
        return route is not None and isinstance(spec, LocalPool) and engine_version(spec.engine) == route.version

    def to_start(self, name: str, spec: LocalPool | RemotePool, promoted: list[str]) -> bool:
        """Whether `spec` asks for a canary of `name` that is not running (nor rolled back by its guard, nor
        starting with the pool)."""
        if not isinstance(spec, LocalPool) or spec.canary is None:
            return False
        version = engine_version(spec.canary.engine)
        route = None if name in promoted else self.routes.get(name)
        if route is not None and route.version == version:
            return False
        return self.rolled_back.get(name, ("", ""))[0] != version and self.starting.get(name) != version

    def settle(self, name: str, spec: LocalPool | RemotePool, started: StartedCanary | None) -> None:
        """Make the canary of `name` what `spec` says: the one just started, the running one with its new weight
        and guard, or none (the running one drains)."""
        canary = spec.canary if isinstance(spec, LocalPool) else None
        route = self.routes.get(name)
        if started is not None:
            self.install(name, *started)
        elif canary is None:
            self.rolled_back.pop(name, None)
            if route is not None:
                log.info("pool %s: canary %s removed by the policy", name, route.version)
                self.drop(name)
        elif route is not None and route.version == engine_version(canary.engine):
            if (route.weight, route.guard) != (canary.weight, canary.guard):
                log.info("pool %s: canary %s now takes %.1f%% of its requests", name, route.version,
                         canary.weight * 100)
            self.routes[name] = replace(route, weight=canary.weight, guard=canary.guard)
