"""`GatewayMetrics.observe_record` through `RecordSeries`: the same series and figures as `labels()` on each record,
also when the cache of children is emptied between records."""

from __future__ import annotations

import dataclasses

import pytest

from gateway.ledger.store import CostRecord
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.record_series import RecordSeries

BASE = CostRecord("r1", "acme", "micro", "m", 10, 3, 7, 40, "threshold", "v1", 1.8e9, None, 120.0)


def _samples(metrics: GatewayMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in metrics.registry.collect() for s in family.samples
            if s.name.startswith(("cascade_requests", "cascade_endpoint", "cascade_tokens", "cascade_cost",
                                  "cascade_savings", "cascade_request_seconds"))}


RECS = [BASE, dataclasses.replace(BASE, request_id="r2", pool="flagship", pool_version="e2"),
        dataclasses.replace(BASE, request_id="r3", status="upstream_error", endpoint="responses"), BASE]


def test_each_record_moves_the_series_of_its_own_labels() -> None:
    metrics = GatewayMetrics(lambda: {})
    for rec in RECS:
        metrics.observe_record(rec)
    got = _samples(metrics)
    assert got[("cascade_requests_total", (("pool", "micro"), ("rule", "threshold"), ("status", "ok"),
                                           ("tenant", "acme"), ("version", "none")))] == 2
    assert got[("cascade_requests_total", (("pool", "flagship"), ("rule", "threshold"), ("status", "ok"),
                                           ("tenant", "acme"), ("version", "e2")))] == 1
    assert got[("cascade_endpoint_requests_total", (("endpoint", "responses"), ("pool", "micro"),
                                                    ("status", "upstream_error")))] == 1
    assert got[("cascade_tokens_total", (("kind", "prompt"), ("pool", "micro")))] == 30
    assert got[("cascade_cost_micro_usd_total", (("pool", "micro"), ("tenant", "acme")))] == 21
    assert got[("cascade_savings_micro_usd_total", (("tenant", "acme"),))] == 4 * 33
    assert got[("cascade_request_seconds_count", (("pool", "flagship"), ("version", "e2")))] == 1
    assert got[("cascade_request_seconds_count", (("pool", "micro"), ("version", "none")))] == 3


@pytest.mark.parametrize("max_keys", [1, 10_000])
def test_the_children_are_those_labels_gives_also_after_the_cache_was_emptied(max_keys: int) -> None:
    metrics = GatewayMetrics(lambda: {})
    series = RecordSeries(metrics, max_keys=max_keys)
    for rec in [*RECS, *RECS]:
        got, version = series.series(rec), rec.pool_version or "none"
        assert got.requests is metrics.requests.labels(rec.pool, rec.rule, rec.status, rec.tenant, version)
        assert got.endpoint_requests is metrics.endpoint_requests.labels(rec.endpoint, rec.pool, rec.status)
        assert got.completion_tokens is metrics.tokens.labels(rec.pool, "completion")
        assert got.latency is metrics.latency.labels(rec.pool, version)
