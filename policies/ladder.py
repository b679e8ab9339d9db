"""The degradation ladder at run time: a pure state machine over the policy's `LadderStep`s.

The caller owns the clock and the measurements: every few seconds it calls
``ladder.update(signals, now)`` with ``signals[(signal_name, pool)] = value`` (see `policies.ladder_schema`
for the signals and their units) and ``now`` in monotonic seconds, and gets the `LadderState` to apply to
requests until the next update. No I/O, no threads; one `Ladder` per gateway process.

Per step: inactive → active when the value is > `enter_above`; active → inactive when the value is
< `exit_below` and the step has been active for >= `hold_s`. A missing (or NaN) signal leaves the step
as it is. Active steps combine (see `LadderState`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from policies.ladder_schema import (
    Action,
    ForceStream,
    LadderStep,
    RaiseThreshold,
    Scope,
    Shed,
    TruncateContext,
)

__all__ = ["ActiveStep", "Ladder", "LadderState", "SignalKey"]

SignalKey = tuple[str, str]
"""(signal name, pool name), e.g. ("kv_cache_usage", "flagship")."""


@dataclass(frozen=True, slots=True)
class ActiveStep:
    """An active step: its name, action, the monotonic time it entered, and the pool it watches with its
    `scope` (whose requests its truncate_context, shed and force_stream act on)."""

    name: str
    action: Action
    since: float
    remap: tuple[str, str] | None = None
    pool: str = ""
    scope: Scope = "pool"

    def acts_on(self, pool: str | None) -> bool:
        """Whether the step shapes a request routed to `pool` (None: not routed yet, only `scope: all`)."""
        return self.scope == "all" or (pool is not None and pool == self.pool)


@dataclass(frozen=True, slots=True)
class LadderState:
    """The combined effect of the active steps (immutable; the empty state changes nothing).

    - `threshold`: the highest raise_threshold (step in `threshold_step`), or None;
    - `truncate_tokens`: the smallest truncate_context limit, or None;
    - `remap`: pool → (pool, step name) for fallback_pool / overflow; the earliest step wins per pool;
    - `force_stream`: any force_stream step is active;
    - `shed_below_priority` / `retry_after_s`: the highest shed priority and the longest Retry-After.

    `combine` counts every active step whatever its scope; `applying_to(pool)` is the state a request
    routed to `pool` gets.
    """

    active: tuple[ActiveStep, ...] = ()
    threshold: float | None = None
    threshold_step: str | None = None
    truncate_tokens: int | None = None
    remap: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    force_stream: bool = False
    shed_below_priority: int | None = None
    retry_after_s: int | None = None

    @property
    def names(self) -> tuple[str, ...]:
        """Names of the active steps, in ladder order."""
        return tuple(s.name for s in self.active)

    def route(self, pool: str) -> tuple[str, tuple[str, ...]]:
        """Where traffic for `pool` goes now, following remaps in turn, and the steps that moved it."""
        steps: list[str] = []
        seen = {pool}
        while pool in self.remap:
            target, step = self.remap[pool]
            if target in seen:  # the loader rejects cycles; never loop forever on a bad ladder anyway
                break
            pool, seen = target, seen | {target}
            steps.append(step)
        return pool, tuple(steps)

    def shed_retry_after(self, priority: int) -> int | None:
        """Retry-After seconds if a tenant of this priority is shed now (answer 429), else None."""
        if self.shed_below_priority is not None and priority < self.shed_below_priority:
            return self.retry_after_s
        return None

    def applying_to(self, pool: str | None) -> LadderState:
        """This state with the request-shaping effects (truncate_tokens, force_stream, shedding) of only the
        steps that act on requests routed to `pool`: `scope: all` steps and `scope: pool` steps watching it;
        None (not routed yet): only `scope: all` steps. `active`, the raised threshold and the pool moves stay
        whole: those act on routing. Always computed from `active`, so it may be applied again."""
        if not self.active and self.truncate_tokens is None and not self.force_stream \
                and self.shed_below_priority is None and self.retry_after_s is None:
            return self  # what the lines below give here, without two new states: the common case, asked per step
        shaped = LadderState.combine([s for s in self.active if s.acts_on(pool)])
        return replace(self, truncate_tokens=shaped.truncate_tokens, force_stream=shaped.force_stream,
                       shed_below_priority=shaped.shed_below_priority, retry_after_s=shaped.retry_after_s)

    @classmethod
    def combine(cls, active: Sequence[ActiveStep]) -> LadderState:
        """The combined effect of `active` (in ladder order)."""
        raises = [(s.action.threshold, s.name) for s in active if isinstance(s.action, RaiseThreshold)]
        top = max(raises, key=lambda r: r[0], default=None)
        limits = [s.action.max_tokens for s in active if isinstance(s.action, TruncateContext)]
        sheds = [s.action for s in active if isinstance(s.action, Shed)]
        remap: dict[str, tuple[str, str]] = {}
        for s in active:
            if s.remap is not None:
                remap.setdefault(s.remap[0], (s.remap[1], s.name))
        return cls(
            active=tuple(active),
            threshold=None if top is None else top[0],
            threshold_step=None if top is None else top[1],
            truncate_tokens=min(limits, default=None),
            remap=remap,
            force_stream=any(isinstance(s.action, ForceStream) for s in active),
            shed_below_priority=max((a.below_priority for a in sheds), default=None),
            retry_after_s=max((a.retry_after_s for a in sheds), default=None),
        )


class Ladder:
    """The ladder's state between updates. Not thread-safe: update it from one task."""

    def __init__(self, steps: Sequence[LadderStep], carry_from: Ladder | None = None) -> None:
        """`carry_from`: a previous ladder (before a policy reload) whose active steps of the same name
        stay active with their entry time, so a reload does not reset hysteresis."""
        self._steps = tuple(steps)
        names = {s.name for s in self._steps}
        self._since: dict[str, float] = {}
        if carry_from is not None:
            self._since = {n: t for n, t in carry_from._since.items() if n in names}
        self._state = self._combine()

    @property
    def state(self) -> LadderState:
        """The state computed by the last `update` (or the carried-over / empty state before any)."""
        return self._state

    def update(self, signals: Mapping[SignalKey, float], now: float) -> LadderState:
        """Apply fresh measurements taken at monotonic time `now` (seconds) and return the new state."""
        for step in self._steps:
            value = signals.get((step.signal, step.pool))
            if value is None or math.isnan(value):
                continue
            since = self._since.get(step.name)
            if since is None and value > step.enter_above:
                self._since[step.name] = now
            elif since is not None and value < step.exit_below and now - since >= step.hold_s:
                del self._since[step.name]
        self._state = self._combine()
        return self._state

    def active_since(self) -> dict[str, float]:
        """Entry time (the caller's clock) of each active step, by name."""
        return dict(self._since)

    def restore(self, since: Mapping[str, float]) -> LadderState:
        """Make exactly the steps in `since` (name -> entry time; unknown names ignored) active, e.g. the
        state another process decided. Returns the new state."""
        names = {s.name for s in self._steps}
        self._since = {n: t for n, t in since.items() if n in names}
        self._state = self._combine()
        return self._state

    def _combine(self) -> LadderState:
        active = [
            ActiveStep(s.name, s.action, self._since[s.name], s.remap, s.pool, s.scope)
            for s in self._steps if s.name in self._since
        ]
        return LadderState.combine(active)

