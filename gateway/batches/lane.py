"""The low-priority lane: a batch line, once routed, is sent only while its pool has headroom, and at most the
policy's `batches.lines_in_flight` lines of this process are on one pool at once (`policies.batches`).

Headroom is read from what the pool already knows: its engines' scraped queue (`waiting`, summed over replicas) and
KV cache use (the fullest replica), scraped in the last `fresh_s` seconds, and this gateway's own requests in flight
on it less the lane's. A line that finds
none polls every `poll_s` and, after `batches.max_wait_s`, raises `LaneBusy`: its worker puts it back on the queue, so
interactive traffic that rises takes the pool back within one poll. Used from one event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Mapping

from backends.clients.pool import Pool
from gateway.errors import GatewayError
from policies.batches import Batches
from policies.loader import LoadedPolicy

__all__ = ["BatchLane", "LaneBusy"]


class LaneBusy(GatewayError):
    """No headroom on the line's pool within the policy's `batches.max_wait_s` (the line goes back on the queue)."""

    status = 503
    type = "service_unavailable"
    code = "batch_lane_busy"


class BatchLane:
    """`pools()` gives the pools by name. `on_change(pool, lines in flight)` is told each change of a pool's lane,
    `on_waiting(lines)` each change of the lines waiting for headroom. `fresh_s`: a pool whose engines' load was last
    scraped longer ago has no headroom until it is scraped again (the pools scrape while the lane is `active`); a
    pool never scraped (a remote one without `/metrics`) is judged on this gateway's own figures alone."""

    def __init__(self, pools: Callable[[], Mapping[str, Pool]], on_change: Callable[[str, int], None] | None = None,
                 on_waiting: Callable[[int], None] | None = None, poll_s: float = 0.05, fresh_s: float = 5.0,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._pools = pools
        self._on_waiting = on_waiting
        self._fresh_s = fresh_s
        self._on_change = on_change
        self._poll_s = poll_s
        self._monotonic = monotonic
        self._held: dict[str, str] = {}  # request id -> pool
        self._per_pool: Counter[str] = Counter()
        self.waiting = 0
        self.last_used = -1e18

    def in_flight(self, pool: str) -> int:
        return self._per_pool[pool]

    def active(self, within_s: float = 30.0) -> bool:
        """Whether a line was in the lane in the last `within_s` seconds (the pools' load is then worth scraping)."""
        return bool(self._held) or self.waiting > 0 or self._monotonic() - self.last_used < within_s

    def headroom(self, bounds: Batches, name: str) -> bool:
        if self._per_pool[name] >= bounds.lines_in_flight:
            return False
        pool = self._pools().get(name)
        if pool is None:
            return True
        scraped = max((r.load.at for r in pool.replicas), default=0.0)
        if 0.0 < scraped < self._monotonic() - self._fresh_s:
            return False  # an idle pool's load is scraped seldom: wait for a fresh scrape (the lane reads it now)
        queue = sum(max(r.load.waiting, 0.0) for r in pool.replicas)
        kv = max((r.load.kv_cache_usage for r in pool.replicas), default=0.0)
        interactive = max(0, pool.in_flight - self._per_pool[name])
        busy = bounds.max_interactive is not None and interactive > bounds.max_interactive
        return queue <= bounds.max_queue and kv <= bounds.max_kv and not busy

    async def enter(self, loaded: LoadedPolicy, pool: str, request_id: str) -> None:
        bounds = loaded.policy.batches
        deadline = self._monotonic() + bounds.max_wait_s
        self._wait(1)
        try:
            while not self.headroom(bounds, pool):
                if self._monotonic() >= deadline:
                    raise LaneBusy(f"pool {pool!r} has had no headroom for batch lines for {bounds.max_wait_s:g} s")
                await asyncio.sleep(self._poll_s)
        finally:
            self._wait(-1)
        self._held[request_id] = pool
        self._moved(pool, 1)

    def leave(self, request_id: str) -> None:
        """The line `request_id` ended (answered or not); its place in the lane is free. Idempotent."""
        pool = self._held.pop(request_id, None)
        if pool is not None:
            self._moved(pool, -1)

    def _wait(self, by: int) -> None:
        self.waiting += by
        if self._on_waiting is not None:
            self._on_waiting(self.waiting)

    def _moved(self, pool: str, by: int) -> None:
        self._per_pool[pool] += by
        self.last_used = self._monotonic()
        if self._on_change is not None:
            self._on_change(pool, self._per_pool[pool])
