"""`OutageSignal`: one warning per check and policy per interval (with the count since the last one), the
gauge while a check cannot reach its store, and one line when checks work again."""

from __future__ import annotations

import logging

import pytest

from gateway.telemetry.metrics import GatewayMetrics
from gateway.tenancy.admission import OutageSignal


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _value(metrics: GatewayMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_warns_once_per_interval_counts_every_request_and_clears(caplog: pytest.LogCaptureFixture) -> None:
    metrics, clock = GatewayMetrics(dict), Clock()
    signal = OutageSignal(metrics, warn_interval_s=30.0, monotonic=clock)
    with caplog.at_level(logging.INFO, logger="cascade.admission"):
        for _ in range(50):
            signal.unchecked("rate_limit", "acme", "fail_closed")
            clock.now += 0.5  # 25 s in all: inside one interval
        for _ in range(3):
            signal.unchecked("rate_limit", "beta", "fail_open")
        clock.now += 10  # 35 s after the first line
        signal.unchecked("rate_limit", "acme", "fail_closed")
        assert _value(metrics, "cascade_admission_store_unreachable", check="rate_limit") == 1
        signal.checked("rate_limit")
        signal.checked("rate_limit")
    lines = [r.getMessage() for r in caplog.records if r.name == "cascade.admission"]
    assert len(lines) == 4, lines  # fail_closed twice (35 s apart), fail_open once, recovery once
    assert "1 request(s)" in lines[0] and "fail_closed: refused with 503" in lines[0]
    assert "fail_open: admitted unchecked" in lines[1]
    assert "50 request(s)" in lines[2]  # the 49 since the first line and this one
    assert "checked again" in lines[3]
    total = "cascade_admission_unchecked_total"
    assert _value(metrics, total, tenant="acme", check="rate_limit", policy="fail_closed") == 51
    assert _value(metrics, total, tenant="beta", check="rate_limit", policy="fail_open") == 3
    assert _value(metrics, "cascade_admission_store_unreachable", check="rate_limit") == 0
