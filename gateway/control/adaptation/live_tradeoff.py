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
- `tradeoff(policy, estimates)` and `in_use(policy)` are computed for the policy they are given, from the window
  last read: after a reload, the first request on the new policy is traded for its own target (`TradeoffInUse`:
  policy, per-request or window-held), never with the tradeoff solved for the policy before. `/readyz` shows it
  under `routing.tradeoff`, and `cascade policy explain --gateway|--redis-url` uses it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import redis.asyncio as aioredis
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.control.adaptation.shared_window import MemoryWindow, RedisWindow, ScoreWindow, WindowSync
from gateway.telemetry.metrics import GatewayMetrics
from policies.schema import Policy
from policies.tiers import TierEstimate, solve_tradeoff

__all__ = ["MIN_SAMPLES", "WINDOW", "LiveTradeoff", "TradeoffCollector", "TradeoffInUse", "entry_of", "parse_entry",
           "start_live_tradeoff", "tradeoff_in_use", "trades_key"]

WINDOW = 2000
MIN_SAMPLES = 50


def trades_key(prefix: str) -> str:
    """The shared trade window's Redis list."""
    return f"{prefix}routing:recent-trades"


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


_Target = tuple[tuple[str, ...], int]  # (tiers, cost_per_1k in micro-USD): what a tradeoff is solved for


def _target(policy: Policy) -> _Target | None:
    routing = policy.routing
    return None if routing.cost_per_1k is None or not routing.tiers else (tuple(routing.tiers), routing.cost_per_1k)


@dataclass(frozen=True, slots=True)
class TradeoffInUse:
    """The tradeoff a tiers policy's requests are traded with, and where it came from (`source`): `policy` (its
    fixed `tradeoff`, 0 without one), `per-request` (a `cost_per_1k` policy whose window holds fewer than
    `MIN_SAMPLES` trades: each request solved on its own, `value` None) or `window-held` (solved over the `samples`
    latest trades of the shared window to hold `cost_per_1k`)."""

    value: float | None
    source: Literal["policy", "per-request", "window-held"]
    samples: int | None = None
    cost_per_1k_usd: float | None = None

    def describe(self) -> str:
        if self.source == "policy":
            return f"{self.value:g} (policy: the policy's fixed routing.tradeoff)"
        target = f"${self.cost_per_1k_usd:.2f} per 1,000 requests"
        if self.source == "per-request":
            return (f"solved on each request alone (per-request: the shared window holds {self.samples} trades, "
                    f"fewer than {MIN_SAMPLES}): the best predicted quality within {target}")
        return f"{self.value:g} (window-held: solved over the {self.samples} latest trades to hold {target})"

    def public(self) -> dict[str, Any]:
        return {"value": self.value, "source": self.source, "samples": self.samples,
                "cost_per_1k_usd": self.cost_per_1k_usd, "description": self.describe()}


def tradeoff_in_use(policy: Policy, entries: Sequence[str]) -> TradeoffInUse | None:
    """What `policy`'s requests are traded with over the window `entries` (newest first); None without tiers."""
    routing = policy.routing
    if not routing.tiers:
        return None
    target = _target(policy)
    return TradeoffInUse(routing.tradeoff or 0.0, "policy") if target is None else _solved(target, entries)


def _solved(target: _Target, entries: Sequence[str]) -> TradeoffInUse:
    rows = [row for row in (parse_entry(e, target[0]) for e in entries) if row is not None]
    usd = target[1] / 1e6
    if len(rows) < MIN_SAMPLES:
        return TradeoffInUse(None, "per-request", len(rows), usd)
    return TradeoffInUse(solve_tradeoff(rows, usd), "window-held", len(rows), usd)


class LiveTradeoff(WindowSync):
    """Holds the live tradeoff of the policy it is asked about; `aclose` stops the refresh task.

    Like the live threshold (`gateway.control.adaptation.live_threshold`), the tradeoff is computed for the policy a
    request carries, from the window last read: after a reload, the first request on the new policy is traded with
    what the window gives its target (or on its own), never with the tradeoff solved for the policy before."""

    TASK, WHAT, KEEPS = "live-tradeoff", "trade window", "tradeoff"

    def __init__(self, window: ScoreWindow, policy: Callable[[], Policy], interval_s: float = 1.0) -> None:
        super().__init__(window, policy, interval_s)
        self._solved: dict[_Target, TradeoffInUse] = {}  # by target: what `_entries` give each

    @property
    def live(self) -> float | None:
        """The current policy's tradeoff solved on the window; None until it holds `MIN_SAMPLES` trades."""
        found = self.in_use(self._policy())
        return None if found is None or found.source != "window-held" else found.value

    @property
    def samples(self) -> int:
        """The current policy's trades in the window as last read."""
        found = self.in_use(self._policy())
        return 0 if found is None or found.samples is None else found.samples

    def in_use(self, policy: Policy) -> TradeoffInUse | None:
        """What `policy`'s requests are traded with now, and where it came from; None without tiers."""
        target = _target(policy)
        if target is None:
            return tradeoff_in_use(policy, ())
        found = self._solved.get(target)
        if found is None:  # a policy this window was not solved for (a reload): solved now, once
            if len(self._solved) >= 4:
                self._solved.clear()
            found = self._solved[target] = _solved(target, self._entries)
        return found

    def tradeoff(self, policy: Policy, estimates: Sequence[TierEstimate]) -> float:
        """The tradeoff to decide this request with: the policy's (0 when it gives none) or, for a cost_per_1k
        policy, the live value for its target (see the module docstring)."""
        if _target(policy) is None:
            return policy.routing.tradeoff or 0.0
        found = self.in_use(policy)
        assert found is not None and found.cost_per_1k_usd is not None  # a cost_per_1k target: solved for it
        return found.value if found.value is not None else solve_tradeoff([estimates], found.cost_per_1k_usd)

    def observe(self, policy: Policy, estimates: Sequence[TierEstimate]) -> None:
        if policy.routing.cost_per_1k is None:
            return
        self._buffer.append(entry_of(estimates))
        del self._buffer[:-WINDOW]

    async def refresh(self) -> None:
        """Push the buffer, read the shared window back and solve (see the module docstring)."""
        policy = self._policy()
        target = _target(policy)
        if target is None:
            self._buffer.clear()
            self._entries, self._solved = [], {}
            return
        entries = await self._exchange(WINDOW)
        if entries is None:
            return
        self._entries, self._solved = entries, {target: _solved(target, entries)}


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
    window: ScoreWindow = MemoryWindow() if client is None else RedisWindow(client, prefix, trades_key(prefix))
    live = LiveTradeoff(window, policy)
    if metrics is not None:
        metrics.register_scrape_time(TradeoffCollector(live, policy), own_view=True)
    live.start()
    return live
