"""The live tradeoff of a `routing.cost_per_1k` policy, shared by every worker through Redis.

Contract (as `gateway.control.adaptation.live_threshold` holds a flagship share):
- Each request decided on a trade is noted (`observe`) in a local buffer: every tier's predicted quality and
  expected cost. Nothing is written per request.
- A background task (`start`) calls `refresh` every `interval_s`: it pushes the buffer to the shared window (a
  capped Redis list under `{prefix}routing:recent-trades`, `WINDOW` entries), reads it back and sets the live
  tradeoff to the smallest one whose choices over the window cost at most `cost_per_1k` per 1,000 requests on
  average (`policies.tiers.solve_tradeoff`). Entries of other tiers (an older policy) are skipped.
- Until a refresh has seen `MIN_SAMPLES` entries, `tradeoff(policy, estimates)` solves on the request itself: the
  best predicted quality whose expected cost is within the target.
- Redis down: the last tradeoff stays, the buffer is kept (capped), the failure is logged once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import redis.asyncio as aioredis
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.control.adaptation.shared_window import MemoryWindow, RedisWindow, ScoreWindow, WindowSync
from gateway.telemetry.metrics import GatewayMetrics
from policies.schema import Policy
from policies.tiers import TierEstimate, solve_tradeoff

__all__ = ["MIN_SAMPLES", "WINDOW", "LiveTradeoff", "TradeoffCollector", "entry_of", "parse_entry",
           "start_live_tradeoff"]

WINDOW = 2000
MIN_SAMPLES = 50


def entry_of(estimates: Sequence[TierEstimate]) -> str:
    """One window entry: "pool:quality:cost;..." (names never hold ":" or ";": `gateway.ledger.record` names)."""
    return ";".join(f"{e.pool}:{e.quality:.5f}:{e.cost_usd:.9f}" for e in estimates)


def parse_entry(entry: str, tiers: Sequence[str]) -> tuple[TierEstimate, ...] | None:
    """The estimates of one entry, or None when it is malformed or names other tiers."""
    try:
        parts = [part.split(":") for part in entry.split(";")]
        row = tuple(TierEstimate(pool, float(q), float(c)) for pool, q, c in parts)
    except ValueError:
        return None
    return row if tuple(e.pool for e in row) == tuple(tiers) else None


class LiveTradeoff(WindowSync):
    """Holds the live tradeoff of the current policy; `aclose` stops the refresh task."""

    TASK, WHAT, KEEPS = "live-tradeoff", "trade window", "tradeoff"

    def __init__(self, window: ScoreWindow, policy: Callable[[], Policy], interval_s: float = 1.0) -> None:
        super().__init__(window, interval_s)
        self._policy = policy
        self._live: float | None = None
        self.samples = 0

    @property
    def live(self) -> float | None:
        """The tradeoff the last refresh solved on the window; None until it holds `MIN_SAMPLES` trades."""
        return self._live

    def tradeoff(self, policy: Policy, estimates: Sequence[TierEstimate]) -> float:
        """The tradeoff to decide this request with: the policy's (0 when it gives none) or, for a cost_per_1k
        policy, the live value (see the module docstring)."""
        target = policy.routing.cost_per_1k
        if target is None:
            return policy.routing.tradeoff or 0.0
        if self._live is None:
            return solve_tradeoff([estimates], target / 1e6)
        return self._live

    def observe(self, policy: Policy, estimates: Sequence[TierEstimate]) -> None:
        if policy.routing.cost_per_1k is None:
            return
        self._buffer.append(entry_of(estimates))
        del self._buffer[:-WINDOW]

    async def refresh(self) -> None:
        """Push the buffer, read the shared window back and solve (see the module docstring)."""
        routing = self._policy().routing
        if routing.cost_per_1k is None or not routing.tiers:
            self._buffer.clear()
            self._live, self.samples = None, 0
            return
        entries = await self._exchange(WINDOW)
        if entries is None:
            return
        rows = [row for row in (parse_entry(e, routing.tiers) for e in entries) if row is not None]
        self.samples = len(rows)
        self._live = solve_tradeoff(rows, routing.cost_per_1k / 1e6) if len(rows) >= MIN_SAMPLES else None


class TradeoffCollector(Collector):
    """/metrics gauges of a `cost_per_1k` policy: the tradeoff in force (absent until the window fills: each request
    is then solved on its own), its target and the trades in the window. Each worker's own, as the threshold's."""

    def __init__(self, live: LiveTradeoff, policy: Callable[[], Policy]) -> None:
        self._live, self._policy = live, policy

    def collect(self) -> Iterable[Metric]:
        target = self._policy().routing.cost_per_1k
        if target is None:
            return
        yield GaugeMetricFamily("cascade_routing_cost_per_1k_target_usd", "mean expected cost per 1,000 requests "
                                "the policy targets (routing.cost_per_1k)", value=target / 1e6)
        yield GaugeMetricFamily("cascade_routing_trade_window", "trades in the shared window", value=self._live.samples)
        if self._live.live is not None:
            yield GaugeMetricFamily("cascade_routing_tradeoff", "tradeoff in force: the quality one USD of expected "
                                    "cost per request is worth", value=self._live.live)


def start_live_tradeoff(client: aioredis.Redis | None, prefix: str, policy: Callable[[], Policy],
                        metrics: GatewayMetrics | None = None) -> LiveTradeoff:
    """A started `LiveTradeoff` on the Redis window (a process-local one without Redis), its gauges registered in
    `metrics`. The caller owns it."""
    window: ScoreWindow = (MemoryWindow() if client is None
                           else RedisWindow(client, prefix, f"{prefix}routing:recent-trades"))
    live = LiveTradeoff(window, policy)
    if metrics is not None:
        metrics.register_scrape_time(TradeoffCollector(live, policy), own_view=True)
    live.start()
    return live
