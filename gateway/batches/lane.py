"""The low-priority lane: a batch line, once routed, is sent only while its pool has headroom, and at most the
policy's `batches.lines_in_flight` lines of this process are on one pool at once (`policies.batches`).

Headroom is read from what the pool already knows: its engines' scraped queue (`waiting`, summed over replicas) and
KV cache use (the fullest replica), scraped in the last `fresh_s` seconds, and this gateway's own requests in flight
on it less the lane's. A line that finds
none polls every `poll_s` and, after `batches.max_wait_s`, raises `LaneBusy`: its worker puts it back on the queue, so
interactive traffic that rises takes the pool back within one poll.

Under the policy's `batches.preempt`, the lane also takes back a pool from the lines already running on it: an
interactive request routed to a pool (`arrived`) that finds it without headroom, counting itself, preempts every
line held on it. Each such line's call (`preemptible`) is cancelled, which closes its upstream request (vLLM aborts
it) before the interactive request is sent, and raises `LinePreempted`: its worker puts the line back on the queue,
to run again from the start (its answer is kept once and its request billed once, as for any line tried again:
`gateway.batches.worker`). An interactive request routed to a pool in the last `poll_s` counts as in flight there
(the engine client counts it only once it is sent, a moment later), so no waiting line slips in meanwhile. Used from
one event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from backends.clients.pool import Pool
from gateway.errors import GatewayError
from policies.batches import Batches
from policies.loader import LoadedPolicy

__all__ = ["BatchLane", "LaneBusy", "LinePreempted"]

T = TypeVar("T")


class LaneBusy(GatewayError, status=503, type="service_unavailable", code="batch_lane_busy"):
    """No headroom on the line's pool within the policy's `batches.max_wait_s` (the line goes back on the queue)."""


class LinePreempted(GatewayError, status=503, type="service_unavailable", code="batch_line_preempted"):
    """An interactive request took the line's pool back while the line ran (`batches.preempt`): the line goes back on
    the queue."""


class BatchLane:
    """`pools()` gives the pools by name. `on_change(pool, lines in flight)` is told each change of a pool's lane,
    `on_waiting(lines)` each change of the lines waiting for headroom, `on_preempt(pool)` each line preempted.
    `fresh_s`: a pool whose engines' load was last scraped longer ago has no headroom until it is scraped again (the
    pools scrape while the lane is `active`); a pool never scraped (a remote one without `/metrics`) is judged on
    this gateway's own figures alone."""

    def __init__(self, pools: Callable[[], Mapping[str, Pool]], on_change: Callable[[str, int], None] | None = None,
                 on_waiting: Callable[[int], None] | None = None, poll_s: float = 0.05, fresh_s: float = 5.0,
                 monotonic: Callable[[], float] = time.monotonic,
                 on_preempt: Callable[[str], None] | None = None) -> None:
        self._pools = pools
        self._on_waiting = on_waiting
        self._fresh_s = fresh_s
        self._on_change = on_change
        self._poll_s = poll_s
        self._monotonic = monotonic
        self._on_preempt = on_preempt
        # request id -> (set when the line is preempted, its call)
        self._preempt: dict[str, tuple[asyncio.Future[None], asyncio.Future[Any]]] = {}
        self._arrived: dict[str, float] = {}  # pool -> when an interactive request was last routed to it
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
        recent = self._monotonic() - self._arrived.get(name, -1e18) < self._poll_s
        return not self._crossed(bounds, name, pool, 1 if recent else 0)

    def _crossed(self, bounds: Batches, name: str, pool: Pool, arriving: int) -> bool:
        """Whether `pool`'s load is past the lane's bounds, with `arriving` interactive requests more on it."""
        queue = sum(max(r.load.waiting, 0.0) for r in pool.replicas)
        kv = max((r.load.kv_cache_usage for r in pool.replicas), default=0.0)
        interactive = max(0, pool.in_flight - self._per_pool[name]) + arriving
        busy = bounds.max_interactive is not None and interactive > bounds.max_interactive
        return queue > bounds.max_queue or kv > bounds.max_kv or busy

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

    async def arrived(self, loaded: LoadedPolicy, pool: str) -> None:
        """An interactive request was routed to `pool`. Under `batches.preempt`, when the pool then has no headroom
        for batch lines (the request counted), every line held on it is preempted: its call cancelled, which this
        waits for (at most `poll_s`), so that the engine hears of the lines' closed requests before the interactive
        request, and aborts them before it schedules that one."""
        self._arrived[pool] = self._monotonic()
        bounds, spec = loaded.policy.batches, self._pools().get(pool)
        if not bounds.preempt or not self._per_pool[pool] or spec is None or not self._crossed(bounds, pool, spec, 1):
            return
        calls = [self._preempt[r] for r, held_on in self._held.items() if held_on == pool and r in self._preempt]
        for signal, sending in calls:
            if not signal.done():
                signal.set_result(None)
                sending.cancel()
        if calls:
            await asyncio.wait([sending for _, sending in calls], timeout=self._poll_s)
            await asyncio.sleep(0)  # the closed connections' transports close on the loop's next turn

    async def preemptible(self, request_id: str, call: Awaitable[T]) -> T:
        """`call`'s result: the call of the line `request_id`, which enters the lane inside it. Preempted first, the
        call is cancelled and `LinePreempted` raised; one that ended meanwhile keeps its result."""
        signal: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        sending = asyncio.ensure_future(call)
        self._preempt[request_id] = signal, sending
        try:
            await asyncio.wait((sending, signal), return_when=asyncio.FIRST_COMPLETED)
        finally:
            del self._preempt[request_id]
            if not sending.done():  # preempted, or this task cancelled: so is the call, which ends first
                sending.cancel()
                await asyncio.wait((sending,))
        if not signal.done() or (not sending.cancelled() and sending.exception() is None):
            return sending.result()
        pool = self._held.get(request_id, "")
        if self._on_preempt is not None:
            self._on_preempt(pool)
        raise LinePreempted(f"an interactive request took pool {pool!r} back while this line ran; it runs again "
                            "later")

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
