"""Draining and retiring what a pool set takes out of routing: a pool, an engine version, a replica.

A replica taken out of routing keeps the requests (and streams) it has: it is stopped once none is in flight
here and, for the `--workers N` parent, none is in flight in the workers nor may still be sent there by one
(`elsewhere`: a worker whose view, published after the replica left routing, still holds it), and not before
`floor_s`, nor later than `grace_s` after it left routing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from backends.background import close_each
from backends.clients.pool import Pool, Replica
from backends.engines.supervisor import EngineSupervisor

__all__ = ["Drainer", "close"]

log = logging.getLogger("cascade.pools")


class Drainer:
    """Waits out the requests of replicas taken out of routing, then stops what served them. Owns nothing: it is
    handed the pool and supervisor to stop."""

    def __init__(self, grace_s: float, floor_s: float = 0.0,
                 elsewhere: Callable[[str, float], int] | None = None) -> None:
        """`elsewhere(url, since)`: how many requests or processes elsewhere still hold the replica at `url`
        (requests in flight to it, and processes that may still send it new ones, not having shown since `since`,
        the wall-clock time it left routing, that they stopped); 0 when none does."""
        self._grace = grace_s
        self._floor = floor_s
        self._elsewhere = elsewhere

    async def drained(self, replicas: list[Replica]) -> None:
        """Wait until no request is in flight on `replicas` (bounded by the grace period)."""
        started, since = time.monotonic(), time.time()
        deadline, floor = started + self._grace, started + self._floor

        def busy() -> bool:
            here = sum(r.in_flight for r in replicas)
            return bool(here or (self._elsewhere is not None
                                 and sum(self._elsewhere(r.url, since) for r in replicas)))

        while (time.monotonic() < floor or busy()) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.2)  # polling a counter the request path owns; no event to wait on

    async def retire(self, name: str, pool: Pool, sup: EngineSupervisor | None) -> None:
        """Drain `pool` (out of routing already), then close it and stop its engines."""
        try:
            await self.drained(pool.replicas)
        finally:  # also when shutdown cancels the wait: the engines must not outlive the gateway
            await close(pool, sup)
        log.info("pool %s stopped", name)

    async def drain_version(self, name: str, replicas: list[Replica], sup: EngineSupervisor | None) -> None:
        """Drain `replicas` of an engine version that no longer takes requests, then stop its engines."""
        try:
            await self.drained(replicas)
        finally:  # also when shutdown cancels the wait: the old engines must not outlive the gateway
            if sup is not None:
                await sup.aclose()
        log.info("pool %s: the old version's engines stopped", name)


async def close(pool: Pool, sup: EngineSupervisor | None) -> None:
    """Close `pool` and stop `sup`'s engines, each whatever the other does (a failure is logged, not raised)."""
    await close_each([(f"pool {pool.name}", pool.aclose),
                      *([(f"the engines of pool {sup.pool}", sup.aclose)] if sup is not None else [])], log)
