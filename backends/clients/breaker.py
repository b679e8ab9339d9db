"""A circuit breaker for one engine replica: stop sending to a replica that keeps failing, then probe it.

States: CLOSED (requests flow) -> OPEN after `failure_threshold` consecutive failures, or when at least
`min_requests` outcomes in the last `window_s` seconds failed at a rate >= `error_rate`. OPEN refuses
requests for `cooldown_s`; after that the breaker is HALF_OPEN and lets exactly one probe request
through. The probe's success closes the breaker (and clears the counts); its failure re-opens it for
another cool-down. A probe that ends without a verdict (the client left, the request was invalid)
gives its slot back with `release()`.

The breaker is not thread-safe: one event loop owns it. Time comes from `clock` (monotonic seconds),
a parameter so that tests drive it with a fake clock.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

__all__ = ["BreakerConfig", "BreakerState", "CircuitBreaker", "Clock"]

Clock = Callable[[], float]


class BreakerState(Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    """When a replica's breaker opens and for how long. Seconds; `error_rate` is a fraction 0..1."""

    failure_threshold: int = 5
    window_s: float = 10.0
    min_requests: int = 20
    error_rate: float = 0.5
    cooldown_s: float = 5.0

    def __post_init__(self) -> None:
        if self.failure_threshold < 1 or self.min_requests < 1:
            raise ValueError("failure_threshold and min_requests must be >= 1")
        if not 0 < self.error_rate <= 1 or self.window_s <= 0 or self.cooldown_s < 0:
            raise ValueError("error_rate must be in (0, 1], window_s > 0, cooldown_s >= 0")


class CircuitBreaker:
    """Per-replica breaker. Callers ask `available()` to filter candidates, `acquire()` for the chosen
    one (which takes the half-open probe slot), then report exactly one of `record_success()`,
    `record_failure()` or `release()` per acquired request."""

    def __init__(self, config: BreakerConfig | None = None, clock: Clock = time.monotonic) -> None:
        self.config = config or BreakerConfig()
        self._clock = clock
        self._state = BreakerState.CLOSED
        self._consecutive = 0
        self._outcomes: deque[tuple[float, bool]] = deque()  # (when, failed) inside the window
        self._failures = 0  # failed ones in `_outcomes`, counted as they come and go (no pass per failure)
        self._opened_at = 0.0
        self._probing = False
        self.opened = 0  # times this breaker opened (for logs and tests)
        self.last_success: float | None = None  # clock time of the last request the replica answered

    @property
    def state(self) -> BreakerState:
        """The current state; an OPEN breaker whose cool-down has passed reads HALF_OPEN."""
        if self._state is BreakerState.OPEN and self._clock() - self._opened_at >= self.config.cooldown_s:
            self._state, self._probing = BreakerState.HALF_OPEN, False
        return self._state

    def available(self) -> bool:
        """True if a request may be sent now (closed, or half-open with its probe slot free)."""
        state = self.state
        return state is BreakerState.CLOSED or (state is BreakerState.HALF_OPEN and not self._probing)

    def acquire(self) -> bool:
        """Claim the right to send one request; in HALF_OPEN this takes the single probe slot."""
        if not self.available():
            return False
        if self._state is BreakerState.HALF_OPEN:
            self._probing = True
        return True

    def answered_within(self, seconds: float) -> bool:
        """True if the replica answered a request in the last `seconds`."""
        return self.last_success is not None and self._clock() - self.last_success < seconds

    def release(self) -> None:
        """An acquired request ended without saying anything about the replica."""
        self._probing = False

    def record_success(self) -> None:
        self._consecutive = 0
        self.last_success = self._clock()
        if self._state is not BreakerState.CLOSED:
            self._close()
            return
        self._note(failed=False)

    def record_failure(self) -> None:
        """A failure re-opens a half-open breaker at once; a closed one opens on the thresholds."""
        self._consecutive += 1
        if self._state is BreakerState.HALF_OPEN:
            self._open()
            return
        if self._state is BreakerState.OPEN:
            return  # a request sent before it opened; the cool-down already runs
        self._note(failed=True)
        if self._consecutive >= self.config.failure_threshold or self._rate_tripped():
            self._open()

    def _note(self, *, failed: bool) -> None:
        now = self._clock()
        self._outcomes.append((now, failed))
        self._failures += failed
        while self._outcomes and now - self._outcomes[0][0] > self.config.window_s:
            self._failures -= self._outcomes.popleft()[1]

    def _rate_tripped(self) -> bool:
        total = len(self._outcomes)
        return total >= self.config.min_requests and self._failures >= self.config.error_rate * total

    def _open(self) -> None:
        self._state, self._opened_at, self._probing = BreakerState.OPEN, self._clock(), False
        self.opened += 1

    def _close(self) -> None:
        self._state, self._probing, self._consecutive = BreakerState.CLOSED, False, 0
        self._outcomes.clear()
        self._failures = 0
