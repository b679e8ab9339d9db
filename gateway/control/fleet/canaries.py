"""Canary versions of pools: which requests a canary takes, and the guard that rolls it back by itself.

A local pool's `canary:` (`policies.pools.Canary`) runs a second engine version beside the pool's own. Its engines
are started, swapped and stopped by `gateway.control.fleet.pool_set`; what the request path reads is a `CanaryRoute`
per pool (`PoolSet.canaries`). A request goes to the canary when `takes_canary` says so: sticky per conversation
(the body's `metadata.conversation_id`, else its `user`), by a hash of the pool and that key, so that raising
the weight only moves conversations from the pool to the canary, never back; a request without either key is
split at random.
"""

from __future__ import annotations

import bisect
import hashlib
import logging
import random
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from backends.clients.pool import Pool
from gateway.telemetry.percentile import nearest_rank_sorted
from policies.pools import CanaryGuard as GuardSpec

__all__ = ["CanaryGuard", "CanaryRoute", "sticky_key", "takes_canary"]

log = logging.getLogger("cascade.canary")


@dataclass(frozen=True, slots=True)
class CanaryRoute:
    """A running canary of a pool: its replicas, its engine version, the model name its engines serve, the share
    of the pool's requests it takes and the guard's bounds (None: no guard)."""

    pool: Pool
    version: str
    model: str
    weight: float
    guard: GuardSpec | None


def sticky_key(raw: Mapping[str, Any]) -> str | None:
    """What keeps a conversation on one version: `metadata.conversation_id`, else `user`; None without either."""
    metadata = raw.get("metadata")
    if isinstance(metadata, dict):
        conversation = metadata.get("conversation_id")
        if isinstance(conversation, str) and conversation:
            return "c:" + conversation
    user = raw.get("user")
    return "u:" + user if isinstance(user, str) and user else None


def takes_canary(pool: str, key: str | None, weight: float) -> bool:
    """Whether a request of `pool` with sticky key `key` goes to a canary that takes `weight` of the traffic."""
    if key is None:
        return random.random() < weight
    digest = hashlib.blake2b(f"{pool}\0{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < weight


@dataclass
class _Window:
    """A canary's outcomes of the last `window_s` in arrival order (time, the answer's TTFT or None, failed), the
    failures counted and the answers' TTFTs kept sorted as they come and go: judging a request costs a lookup, not
    a pass over the window and a sort (a 300 s window of a canary at 100 requests/s holds 30,000)."""

    outcomes: deque[tuple[float, float | None, bool]] = field(default_factory=deque)
    errors: int = 0
    ttfts: list[float] = field(default_factory=list)

    def add(self, now: float, ttft_s: float | None, error: bool) -> None:
        answered = None if error else ttft_s  # a failed request's TTFT is not an answer's
        self.outcomes.append((now, answered, error))
        self.errors += error
        if answered is not None:
            bisect.insort(self.ttfts, answered)

    def drop_before(self, since: float) -> None:
        while self.outcomes and self.outcomes[0][0] < since:
            _, answered, error = self.outcomes.popleft()
            self.errors -= error
            if answered is not None:
                del self.ttfts[bisect.bisect_left(self.ttfts, answered)]

    def __len__(self) -> int:
        return len(self.outcomes)


class CanaryGuard:
    """Keeps a window of each guarded canary's outcomes and calls `on_trip(pool, version, reason)` once one passes
    its bounds (`policies.pools.CanaryGuard`): its error rate, or its p95 time to first token, over at least
    `min_requests` requests of the last `window_s` seconds. Outcomes of a version that is not the pool's current
    canary are ignored. Used from the event loop only."""

    def __init__(self, routes: Mapping[str, CanaryRoute], on_trip: Callable[[str, str, str], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._routes = routes
        self._on_trip = on_trip
        self._clock = clock
        self._windows: dict[tuple[str, str], _Window] = {}

    def observe(self, pool: str, version: str, ttft_s: float | None, error: bool) -> None:
        route = self._routes.get(pool)
        if route is None or route.version != version or route.guard is None:
            return
        guard, now = route.guard, self._clock()
        window = self._windows.setdefault((pool, version), _Window())
        window.add(now, ttft_s, error)
        window.drop_before(now - guard.window_s)
        if len(window) < guard.min_requests:
            return
        reason = _passed(guard, window)
        if reason is not None:
            del self._windows[(pool, version)]
            log.error("pool %s: canary %s rolled back by its guard: %s", pool, version, reason)
            self._on_trip(pool, version, reason)

    def forget(self, pool: str) -> None:
        """Drop the windows of `pool`'s canaries (it was promoted, rolled back or replaced)."""
        for key in [k for k in self._windows if k[0] == pool]:
            del self._windows[key]


def _passed(guard: GuardSpec, window: _Window) -> str | None:
    """Why the window passes the guard's bounds, or None."""
    rate = window.errors / len(window)
    if guard.max_error_rate is not None and rate > guard.max_error_rate:
        return (f"error rate {rate:.1%} over its last {len(window)} requests is above max_error_rate "
                f"{guard.max_error_rate:.1%}")
    ttfts = window.ttfts
    if guard.max_p95_ttft_ms is not None and len(ttfts) >= guard.min_requests:
        p95_ms = nearest_rank_sorted(ttfts, 0.95) * 1000
        if p95_ms > guard.max_p95_ttft_ms:
            return (f"p95 time to first token {p95_ms:.0f} ms over its last {len(ttfts)} answers is above "
                    f"max_p95_ttft_ms {guard.max_p95_ttft_ms:.0f}")
    return None
