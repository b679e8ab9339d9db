"""The degradation monitor's own signals: an idle pool reads calm, a busy one without data stays put, and
`in_flight` is the open requests to the pool right now."""

from __future__ import annotations

from backends.clients.pool import Pool
from gateway.control.degradation import DegradationMonitor
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
