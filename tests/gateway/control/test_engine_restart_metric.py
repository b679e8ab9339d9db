"""The supervisor's restarts reach /metrics through the pool set's hook."""

from __future__ import annotations

from gateway.telemetry.metrics import GatewayMetrics


def test_engine_restarts_are_counted_by_pool_and_reason() -> None:
    metrics = GatewayMetrics(lambda: {})
    metrics.engine_restarted("micro", 0, "hung")
    metrics.engine_restarted("micro", 1, "exited")
    metrics.engine_restarted("micro", 0, "hung")
    text = metrics.render().decode()
    assert 'cascade_engine_restarts_total{pool="micro",reason="hung"} 2.0' in text
    assert 'cascade_engine_restarts_total{pool="micro",reason="exited"} 1.0' in text
