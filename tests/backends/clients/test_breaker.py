"""The per-replica circuit breaker, driven by a fake clock, and its use by `Pool.choose`."""

from __future__ import annotations

import random

import pytest

from backends.clients.breaker import BreakerConfig, BreakerState, CircuitBreaker
from backends.clients.pool import Pool


def _state(breaker: CircuitBreaker) -> BreakerState:
    """Read afresh (the state changes under mypy's feet: it is time-driven)."""
    return breaker.state


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _breaker(clock: FakeClock, **kw: float) -> CircuitBreaker:
    config = BreakerConfig(**{"failure_threshold": 3, "cooldown_s": 5.0, "min_requests": 10, **kw})  # type: ignore[arg-type]
    return CircuitBreaker(config, clock)


def test_opens_after_consecutive_failures_and_refuses_during_cooldown() -> None:
    clock = FakeClock()
    b = _breaker(clock)
    for _ in range(2):
        assert b.acquire()
        b.record_failure()
    assert _state(b) is BreakerState.CLOSED
    b.record_success()  # a success resets the consecutive count
    for _ in range(2):
        b.record_failure()
    assert _state(b) is BreakerState.CLOSED
    b.record_failure()
    assert _state(b) is BreakerState.OPEN and b.opened == 1
    clock.now += 4.9
    assert not b.available() and not b.acquire()


def test_half_open_lets_exactly_one_probe_through_and_success_closes() -> None:
    clock = FakeClock()
    b = _breaker(clock)
    for _ in range(3):
        b.record_failure()
    clock.now += 5.0
    assert _state(b) is BreakerState.HALF_OPEN
    assert b.acquire()
    assert not b.available() and not b.acquire()  # the probe is in flight: nobody else
    b.record_success()
    assert _state(b) is BreakerState.CLOSED
    assert b.acquire() and b.acquire()
    b.record_failure()
    b.record_failure()
    assert _state(b) is BreakerState.CLOSED  # counts were cleared on close


def test_failed_probe_reopens_for_a_full_cooldown() -> None:
    clock = FakeClock()
    b = _breaker(clock)
    for _ in range(3):
        b.record_failure()
    clock.now += 6.0
    assert b.acquire()
    b.record_failure()
    assert _state(b) is BreakerState.OPEN and b.opened == 2
    clock.now += 4.0
    assert not b.available()
    clock.now += 1.0
    assert _state(b) is BreakerState.HALF_OPEN and b.available()


def test_released_probe_frees_the_slot_without_a_verdict() -> None:
    clock = FakeClock()
    b = _breaker(clock)
    for _ in range(3):
        b.record_failure()
    clock.now += 5.0
    assert b.acquire()
    b.release()
    assert _state(b) is BreakerState.HALF_OPEN and b.acquire()


def test_error_rate_window_opens_without_a_consecutive_run() -> None:
    clock = FakeClock()
    b = _breaker(clock, failure_threshold=100, min_requests=10, error_rate=0.5, window_s=10.0)
    for i in range(9):  # alternate: never 2 failures in a row, 5 of 9 failed, but below min_requests
        b.record_failure() if i % 2 == 0 else b.record_success()
    assert _state(b) is BreakerState.CLOSED
    b.record_failure()  # 6 of 10 failed
    assert _state(b) is BreakerState.OPEN


def test_error_rate_forgets_outcomes_older_than_the_window() -> None:
    clock = FakeClock()
    b = _breaker(clock, failure_threshold=100, min_requests=10, error_rate=0.5, window_s=10.0)
    for _ in range(8):
        b.record_failure()
        b.record_success()
    clock.now += 11.0  # all 16 outcomes leave the window
    for _ in range(9):
        b.record_success()
    b.record_failure()
    assert _state(b) is BreakerState.CLOSED  # 1 of 10 in the window


def test_the_windows_failure_count_equals_a_recount_as_outcomes_come_and_go() -> None:
    """Counted as outcomes enter and leave the window (a failure no longer recounts the window: at 4,000
    requests/s a 10 s window holds 40,000), the count equals a recount at every step of a seeded mix; a
    rate that never reaches the bound leaves the breaker closed, and closing after a probe starts afresh."""
    rng = random.Random(3)
    clock = FakeClock()
    b = _breaker(clock, failure_threshold=10**6, min_requests=10, error_rate=0.6, window_s=2.0)
    seen: list[tuple[float, bool]] = []
    for _ in range(3_000):
        clock.now += rng.choice([0.0, 0.001, 0.05])
        failed = rng.random() < 0.3
        b.record_failure() if failed else b.record_success()
        seen.append((clock.now, failed))
        kept = [f for t, f in seen if clock.now - t <= 2.0]
        assert len(b._outcomes) == len(kept) and b._failures == sum(kept)
    assert _state(b) is BreakerState.CLOSED  # 30% never reached 60% over 10 or more
    for _ in range(400):  # a run of failures lifts the window's rate past 60%
        b.record_failure()
    assert _state(b) is BreakerState.OPEN
    clock.now += 5.0  # the cool-down: a probe that succeeds closes it with an empty window
    assert b.acquire()
    b.record_success()
    assert _state(b) is BreakerState.CLOSED and b._failures == 0 and not b._outcomes


def test_late_failure_while_open_does_not_extend_the_cooldown() -> None:
    clock = FakeClock()
    b = _breaker(clock)
    for _ in range(3):
        b.record_failure()
    clock.now += 4.0
    b.record_failure()  # a request sent before it opened
    clock.now += 1.0
    assert _state(b) is BreakerState.HALF_OPEN


def test_config_is_validated() -> None:
    with pytest.raises(ValueError):
        BreakerConfig(failure_threshold=0)
    with pytest.raises(ValueError):
        BreakerConfig(error_rate=0)


def test_pool_skips_open_replicas_probes_half_open_ones_and_reports_readiness() -> None:
    clock = FakeClock()
    pool = Pool("p", ["http://a", "http://b"], None, breaker=BreakerConfig(failure_threshold=2, cooldown_s=5),  # type: ignore[arg-type]
                clock=clock)
    a, b = pool.replicas
    a.healthy = b.healthy = True
    b.in_flight = 3  # a is the least loaded
    for _ in range(2):
        a.breaker.record_failure()
    assert pool.choose() is b  # a is open
    assert pool.ready
    for _ in range(2):
        b.breaker.record_failure()
    assert pool.choose() is None and not pool.ready
    clock.now += 5
    assert pool.ready  # half-open replicas can be probed
    first = pool.choose()
    second = pool.choose()
    assert first is not None and second is not None
    assert {first.url, second.url} == {a.url, b.url} and pool.choose() is None  # one probe each
    first.breaker.record_success()
    assert pool.choose() is first
    pool.set_urls(["http://a", "http://c"])
    assert pool.replicas[0] is a and pool.replicas[1].breaker.config.failure_threshold == 2
