"""The degradation monitor's own signals: an idle pool reads calm, a busy one without data stays put,
`in_flight` is the open requests to the pool right now, and the error rate and TTFT p95 follow the window as
requests enter and leave it (counted as they go, the p95 over the newest `TTFT_SAMPLES`)."""

from __future__ import annotations

import pytest

from backends.clients.pool import Pool
from gateway.control.adaptation.degradation import TTFT_SAMPLES, DegradationMonitor
from gateway.control.adaptation.ladder_sync import MAX_SAMPLES
from tests.gateway.control.test_ladder_sync import _loaded


class _NoClient:  # the monitor never talks to engines; the pool only needs something to hold
    pass


def _monitor() -> tuple[DegradationMonitor, Pool]:
    pool = Pool("flagship", ["http://127.0.0.1:9"], _NoClient())  # type: ignore[arg-type]
    monitor = DegradationMonitor(lambda: {"flagship": pool}, window_s=10)
    monitor.use_policy(_loaded(hold_s=5))
    return monitor, pool


def test_a_step_on_request_signals_releases_once_the_pool_is_idle() -> None:
    monitor, _ = _monitor()
    for _ in range(4):
        monitor.observe("flagship", error=True)
    assert monitor.tick().names == ("errors-high",)
    # no traffic at all afterwards: once the window has emptied the pool is idle, so the step lets go
    later = monitor.tick(now=10**6)
    assert later.names == ()


def test_a_busy_pool_without_finished_requests_keeps_its_step() -> None:
    monitor, pool = _monitor()
    for _ in range(4):
        monitor.observe("flagship", error=True)
    assert monitor.tick().names == ("errors-high",)
    pool.replicas[0].in_flight = 3  # requests still running, none finished in the window: no verdict
    assert monitor.tick(now=10**6).names == ("errors-high",)


def test_in_flight_is_the_open_requests_of_the_pool_now() -> None:
    pool = Pool("flagship", ["http://127.0.0.1:9", "http://127.0.0.1:10"], _NoClient())  # type: ignore[arg-type]
    monitor = DegradationMonitor(lambda: {"flagship": pool}, window_s=10)
    assert monitor.signals(0.0)[("in_flight", "flagship")] == 0.0
    pool.replicas[0].in_flight, pool.replicas[1].in_flight = 3, 2
    assert monitor.signals(0.0)[("in_flight", "flagship")] == 5.0
    assert monitor._report().in_flight == {"flagship": 5}


def test_the_error_rate_follows_requests_into_and_out_of_the_window(monkeypatch: pytest.MonkeyPatch) -> None:
    monitor, _ = _monitor()  # a 10 s window
    clock = [100.0]
    monkeypatch.setattr("gateway.control.adaptation.degradation.time.monotonic", lambda: clock[0])
    for second, failed in enumerate([True, True, False, False, True, False, False, False]):
        clock[0] = 100.0 + second
        monitor.observe("flagship", error=failed)
    assert monitor.signals(107.0)[("error_rate", "flagship")] == 3 / 8
    assert monitor._report().outcomes == {"flagship": (3, 8)}
    assert monitor.signals(111.5)[("error_rate", "flagship")] == 1 / 6  # the two failures at 100 and 101 left
    assert monitor.signals(114.5)[("error_rate", "flagship")] == 0.0  # so did the one at 104
    clock[0] = 115.0
    monitor.observe("flagship", error=True)
    assert monitor.signals(115.0)[("error_rate", "flagship")] == 1 / 4
    assert monitor.signals(200.0)[("error_rate", "flagship")] == 0.0  # an empty window, nothing in flight: calm
    assert monitor._errors["flagship"] == 0 and not monitor._outcomes["flagship"]


def test_the_ttft_p95_reads_the_newest_samples_of_the_window(monkeypatch: pytest.MonkeyPatch) -> None:
    monitor, _ = _monitor()
    monkeypatch.setattr("gateway.control.adaptation.degradation.time.monotonic", lambda: 50.0)
    for ms in range(1, 101):  # 1..100 ms: p95 by nearest rank is 95 ms
        monitor.observe("flagship", ttft_s=ms / 1000)
    assert monitor.signals(50.0)[("ttft_p95_s", "flagship")] == 0.095
    for _ in range(TTFT_SAMPLES):  # a burst of fast first tokens pushes the older ones out of the sample
        monitor.observe("flagship", ttft_s=0.001)
    assert monitor.signals(50.0)[("ttft_p95_s", "flagship")] == 0.001
    report = monitor._report()
    assert len(report.ttft["flagship"]) == MAX_SAMPLES and report.outcomes == {"flagship": (0, 100 + TTFT_SAMPLES)}
