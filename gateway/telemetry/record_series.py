"""The labelled series one cost record moves, looked up once per combination of labels instead of per record.

`prometheus_client`'s `labels()` checks and converts every label value and takes a lock on each call; a record moves
eight series, so at saturation those calls were a visible share of the gateway's CPU per request. `RecordSeries`
keeps, per (pool, rule, status, tenant, version, endpoint), the children it got from `labels()` once. The children
are the ones `labels()` would return (nothing here removes a series), so the figures are the same. Used from one
event loop; the cache is emptied past `max_keys` combinations (looking them up again is harmless).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from prometheus_client import Counter, Histogram

from gateway.ledger.store import CostRecord

__all__ = ["RecordFamilies", "RecordSeries"]


@dataclass(frozen=True, slots=True)
class _Series:
    requests: Counter
    endpoint_requests: Counter
    endpoint_cost: Counter
    prompt_tokens: Counter
    completion_tokens: Counter
    cost: Counter
    savings: Counter
    latency: Histogram


class RecordFamilies(Protocol):
    """The metric families a record moves (`gateway.telemetry.metrics.GatewayMetrics` has them)."""

    requests: Counter
    endpoint_requests: Counter
    endpoint_cost: Counter
    tokens: Counter
    cost: Counter
    savings: Counter
    latency: Histogram


class RecordSeries:
    """The children of `metrics` (its `requests`, `endpoint_requests`, `endpoint_cost`, `tokens`, `cost`, `savings`
    and `latency`) that `series(rec)` returns for a record's labels."""

    def __init__(self, metrics: RecordFamilies, max_keys: int = 10_000) -> None:
        self._m = metrics
        self._max = max_keys
        self._cache: dict[tuple[str, ...], _Series] = {}

    def series(self, rec: CostRecord) -> _Series:
        version = rec.pool_version or "none"
        key = (rec.pool, rec.rule, rec.status, rec.tenant, version, rec.endpoint)
        found = self._cache.get(key)
        if found is None:
            if len(self._cache) >= self._max:
                self._cache.clear()
            m = self._m
            found = self._cache[key] = _Series(
                m.requests.labels(rec.pool, rec.rule, rec.status, rec.tenant, version),
                m.endpoint_requests.labels(rec.endpoint, rec.pool, rec.status),
                m.endpoint_cost.labels(rec.endpoint, rec.pool),
                m.tokens.labels(rec.pool, "prompt"), m.tokens.labels(rec.pool, "completion"),
                m.cost.labels(rec.pool, rec.tenant), m.savings.labels(rec.tenant), m.latency.labels(rec.pool, version))
        return found
