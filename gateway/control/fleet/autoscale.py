"""Replicas that follow load: the decision loop of a pool's `autoscale:` (`policies.autoscale`).

Every `interval_s` it reads each autoscaled pool's signals (the degradation monitor's: the ladder and the
autoscaler watch the same figures) and decides, per pool:
- **up** when the mean of any `scale_up` signal over the last `sustained_s` passes its bound, below
  `max_replicas` (a mean, not every sample: under a real surge the gateway's in-flight count still dips to 0
  between bursts; measured on the demo engines, no 5 s run of 1 s samples stayed above 2 while the ladder, at 3,
  shed);
- **down** when the pool has had nothing in flight and nothing queued for `scale_down_after_idle_s`, above
  `min_replicas`;
- nothing within `cooldown_s` of the last change (or failed attempt), nor while a change is under way.
The change itself (room check, start beside the others, drain before stop) is `PoolSet.scale_up` /
`scale_down`. Only the process that runs the engines decides (`Settings.start_engines`); under `--workers N` that
is the parent (`gateway.control.engine_host`), which counts its changes in `gateway.telemetry.parent_counters`.
Every change ends in one `ScaleEvent`, whatever it raised: a pool a reload removed between the tick and the change,
or any other error, is outcome "failed", logged with its traceback (docs/scaling.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from backends.engines.room import NoRoom
from backends.engines.supervisor import EngineStartError
from gateway.control.fleet.pool_set import PoolSet
from policies.autoscale import Autoscale
from policies.schema import LocalPool

__all__ = ["Autoscaler", "ScaleState", "decide", "pressure"]

log = logging.getLogger("cascade.autoscale")

Signals = Callable[[float], Mapping[tuple[str, str], float]]
ScaleEvent = Callable[[str, str, str], None]
"""(pool, "up" | "down", outcome: "done" | "no_room" | "start_failed" | "failed"): the metrics' counter."""


@dataclass(slots=True)
class ScaleState:
    """What the loop remembers of one pool between ticks: the samples of its `scale_up` signals over the last
    `sustained_s` (and the one just before), since when it has been idle, and its last change."""

    samples: deque[tuple[float, dict[str, float]]] = field(default_factory=deque)
    idle_since: float | None = None
    changed_at: float = -math.inf
    busy: bool = False
    last: str = ""  # the last decision or refusal, for /readyz


def pressure(scale: Autoscale, state: ScaleState, now: float, signals: Mapping[tuple[str, str], float],
             pool: str) -> str | None:
    """Record this tick's signals of `pool` in `state`; the first `scale_up` bound that its signal's mean over the
    last `sustained_s` passes, said as "kv_cache_usage averaged 0.93 > 0.8 over 20 s"; None if none, or while the
    samples do not cover `sustained_s` yet (a missing signal is no pressure)."""
    bounds, window = scale.scale_up.bounds(), scale.scale_up.sustained_s
    state.samples.append((now, {s: signals.get((s, pool), math.nan) for s in bounds}))
    while len(state.samples) > 1 and state.samples[1][0] <= now - window:
        state.samples.popleft()
    if state.samples[0][0] > now - window:
        return None
    for signal, bound in bounds.items():
        values = [v[signal] for _, v in state.samples if not math.isnan(v[signal])]
        mean = sum(values) / len(values) if values else math.nan
        if not math.isnan(mean) and mean > bound:
            return f"{signal} averaged {mean:.3g} > {bound:g} over {window:g} s"
    return None


def decide(scale: Autoscale, replicas: int, state: ScaleState, now: float, over: str | None,
           idle: bool) -> tuple[str, str] | None:
    """("up" | "down", why) or None, given `pressure`'s verdict; updates the idle clock in `state`."""
    state.idle_since = None if not idle else now if state.idle_since is None else state.idle_since
    if state.busy or now - state.changed_at < scale.cooldown_s:
        return None
    if over is not None and replicas < scale.max_replicas:
        return "up", over
    if state.idle_since is not None and replicas > scale.min_replicas:
        lasted = now - state.idle_since
        if lasted >= scale.scale_down_after_idle_s:
            return "down", f"idle for {lasted:.0f} s"
    return None


class Autoscaler:
    """Owns its loop task and the tasks of the changes it starts (`start` / `aclose`); shares the pool set."""

    def __init__(self, pool_set: PoolSet, signals: Signals, on_event: ScaleEvent | None = None,
                 interval_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._pools = pool_set
        self._signals = signals
        self._on_event = on_event
        self._interval = interval_s
        self._clock = clock
        self.states: dict[str, ScaleState] = {}
        self._task: asyncio.Task[None] | None = None
        self._changes: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="autoscale")

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                self.tick()
            except Exception:  # one bad tick must not end autoscaling
                log.exception("autoscale tick failed")

    def tick(self) -> None:
        """One decision per autoscaled pool whose engines this process runs; a change runs in its own task."""
        now = self._clock()
        signals = self._signals(now)
        for name, spec in list(self._pools.specs.items()):
            scale = spec.autoscale if isinstance(spec, LocalPool) else None
            sup = self._pools.supervisors.get(name)
            if scale is None or sup is None or not sup.ready_urls:
                continue
            state = self.states.setdefault(name, ScaleState())
            idle = signals.get(("in_flight", name), 0.0) == 0 and signals.get(("queue_depth", name), 0.0) == 0
            over = pressure(scale, state, now, signals, name)
            decision = decide(scale, len(sup.replicas), state, now, over, idle)
            if decision is not None:
                state.busy = True
                task = asyncio.create_task(self.change(name, *decision), name=f"autoscale:{name}")
                self._changes.add(task)
                task.add_done_callback(self._changes.discard)

    async def change(self, name: str, direction: str, why: str) -> None:
        """Add ("up") or remove ("down") one replica of pool `name` now, for reason `why`; never raises but
        `CancelledError`. Its outcome is reported to `on_event` and kept in `status` (see the module docstring)."""
        state = self.states.setdefault(name, ScaleState())
        outcome = "done"
        try:
            if direction == "up":
                log.info("pool %s: adding a replica (%s)", name, why)
                state.last = f"adding a replica: {why}"
                count = await self._pools.scale_up(name)
            else:
                log.info("pool %s: removing a replica (%s)", name, why)
                state.last = f"removing a replica: {why}"
                count = await self._pools.scale_down(name)
            state.last = f"{'added' if direction == 'up' else 'removed'} a replica ({why}): {count} now"
            log.info("pool %s: %s", name, state.last)
        except NoRoom as exc:
            outcome = "no_room"
            state.last = f"cannot grow ({why}): {exc}"
            log.warning("pool %s: %s", name, state.last)
        except (EngineStartError, OSError) as exc:
            outcome = "start_failed"
            state.last = f"the new replica did not start ({why}): {str(exc).splitlines()[0]}"
            log.error("pool %s: %s", name, state.last)
        except Exception as exc:  # a pool removed by a reload meanwhile (KeyError), a supervisor's RuntimeError
            outcome = "failed"
            state.last = f"could not {'add' if direction == 'up' else 'remove'} a replica ({why}): {exc!r}"
            log.exception("pool %s: %s", name, state.last)
        finally:
            state.busy, state.changed_at, state.idle_since = False, self._clock(), None
            state.samples.clear()  # judged again from the new count
        if self._on_event is not None:
            self._on_event(name, direction, outcome)

    def status(self) -> dict[str, dict[str, object]]:
        """Per autoscaled pool: replicas now, bounds, and the last decision (for /readyz)."""
        out: dict[str, dict[str, object]] = {}
        for name, spec in self._pools.specs.items():
            scale = spec.autoscale if isinstance(spec, LocalPool) else None
            if scale is None:
                continue
            sup = self._pools.supervisors.get(name)
            state = self.states.get(name, ScaleState())
            out[name] = {"replicas": len(sup.replicas) if sup is not None else 0, "min": scale.min_replicas,
                         "max": scale.max_replicas, "changing": state.busy, "last": state.last}
        return out

    async def aclose(self) -> None:
        for task in [t for t in (self._task, *self._changes) if t is not None]:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
