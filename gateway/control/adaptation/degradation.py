"""Feed the policy's degradation ladder with live signals and keep its current state.

Signals per pool, refreshed every `interval_s`: `kv_cache_usage` (the highest replica's, as scraped
from vLLM), `queue_depth` (waiting requests summed over replicas, as scraped), `ttft_p95_s` and
`error_rate` over the last `window_s` seconds of this gateway's own requests, and `in_flight` (this
gateway's open requests to the pool, now). A tick costs the event loop the same at any request rate: the error
rate is counted as requests arrive and leave the window, and `ttft_p95_s` is the p95 of the newest `TTFT_SAMPLES`
TTFTs in the window (all of them below about 68 streams/s over 30 s; at 4,000 requests/s a tick over every
request in the window held the loop about 12 ms each second). The ladder itself
(hysteresis, hold times, combined effect) is `policies.ladder`; this module only measures and logs.
With `share(LadderSync)` the state is one for every process on the same Redis: a leader decides on the
merged signals of all of them and the others adopt its decision (see `gateway.control.adaptation.ladder_sync`).
While that Redis cannot be reached each tick decides locally; the warning saying so is logged at most once every
`warn_interval_s` (with the number of ticks since the last line), and one info line when the shared ladder
answers again.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from itertools import islice

from backends.background import cancel_requested, stop
from backends.clients.pool import Pool
from gateway.control.adaptation.ladder_sync import MAX_SAMPLES, LadderSync, Report, merge_reports
from gateway.logs import LogThrottle
from gateway.redis_client import REDIS_FAILURES
from gateway.telemetry.percentile import nearest_rank
from policies.ladder import Ladder, LadderState
from policies.loader import LoadedPolicy

__all__ = ["DegradationMonitor", "engine_signals"]

log = logging.getLogger("cascade.degradation")

TTFT_SAMPLES = 2048
"""Newest TTFTs per pool that `ttft_p95_s` reads (sorting them takes about 0.2 ms)."""

_REQUEST_SIGNALS = ("ttft_p95_s", "error_rate")
"""Signals measured on this gateway's finished requests (the others are scraped from the engines)."""


def engine_signals(name: str, pool: Pool) -> dict[tuple[str, str], float]:
    """The signals a pool's engines report, as scraped: `kv_cache_usage` (highest replica) and `queue_depth`
    (summed). The ladder and the autoscaler read them alike, also in the `--workers` parent."""
    return {("kv_cache_usage", name): max((r.load.kv_cache_usage for r in pool.replicas), default=0.0),
            ("queue_depth", name): sum(r.load.waiting for r in pool.replicas)}


class DegradationMonitor:
    """Owns the ladder, the rolling windows and one background task (`start` / `aclose`)."""

    def __init__(self, pools: Callable[[], Mapping[str, Pool]], interval_s: float = 1.0, window_s: float = 30.0,
                 on_change: Callable[[set[str], set[str]], None] | None = None, warn_interval_s: float = 30.0,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        """`on_change(engaged, released)` is called with step names whenever the active set changes.
        `warn_interval_s` spaces the "shared ladder unavailable" warnings (`monotonic` is their clock)."""
        self._pools = pools
        self._unshared = LogThrottle(warn_interval_s, monotonic)
        self._on_change = on_change
        self._interval = interval_s
        self._window = window_s
        self._ladder = Ladder(())
        self._version: str | None = None
        self._ttft: dict[str, deque[tuple[float, float]]] = {}
        self._outcomes: dict[str, deque[tuple[float, bool]]] = {}
        self._errors: dict[str, int] = {}  # failed requests in each pool's `_outcomes`
        self._task: asyncio.Task[None] | None = None
        self._sync: LadderSync | None = None
        self.leader = False
        """True while this process decides the shared ladder (always False without `share`)."""

    def share(self, sync: LadderSync | None) -> None:
        """Decide the ladder with the other processes on `sync`'s Redis (None: this process alone)."""
        self._sync = sync

    @property
    def state(self) -> LadderState:
        return self._ladder.state

    def use_policy(self, loaded: LoadedPolicy) -> None:
        """Adopt the ladder of a (re)loaded policy, keeping steps of the same name active."""
        if loaded.version != self._version:
            steps = loaded.policy.degradation.steps
            self._ladder = Ladder(steps, carry_from=self._ladder)
            self._version = loaded.version

    def observe(self, pool: str, ttft_s: float | None = None, error: bool = False) -> None:
        """One finished request of `pool` (or one that failed at the engine)."""
        now = time.monotonic()
        self._outcomes.setdefault(pool, deque()).append((now, error))
        if error:
            self._errors[pool] = self._errors.get(pool, 0) + 1
        if ttft_s is not None:
            self._ttft.setdefault(pool, deque(maxlen=TTFT_SAMPLES)).append((now, ttft_s))

    def _trim(self, now: float) -> None:
        for q in self._ttft.values():
            while q and now - q[0][0] > self._window:
                q.popleft()
        for pool, outcomes in self._outcomes.items():
            while outcomes and now - outcomes[0][0] > self._window:
                if outcomes.popleft()[1]:
                    self._errors[pool] -= 1

    def signals(self, now: float) -> dict[tuple[str, str], float]:
        self._trim(now)
        out: dict[tuple[str, str], float] = {}
        for name, pool in self._pools().items():
            out.update(engine_signals(name, pool))
            out[("ttft_p95_s", name)] = nearest_rank([v for _, v in self._ttft.get(name, ())], 0.95)
            requests = len(self._outcomes.get(name, ()))
            out[("error_rate", name)] = self._errors.get(name, 0) / requests if requests else math.nan
            out[("in_flight", name)] = float(pool.in_flight)
        return self._idle_is_calm(out)

    def _idle_is_calm(self, signals: dict[tuple[str, str], float]) -> dict[tuple[str, str], float]:
        """A pool with no request finished in the window and none in flight is idle: its TTFT and error
        signals read 0, not "no data", so a step engaged on them can release once traffic has gone."""
        for name, pool in self._pools().items():
            if pool.in_flight:
                continue
            for signal in _REQUEST_SIGNALS:
                if math.isnan(signals.get((signal, name), math.nan)):
                    signals[(signal, name)] = 0.0
        return signals

    def tick(self, now: float | None = None) -> LadderState:
        now = time.monotonic() if now is None else now
        before = set(self._ladder.state.names)
        state = self._ladder.update(self.signals(now), now)
        self._announce(before, state)
        return state

    def _report(self) -> Report:
        ttft = {p: [v for _, v in islice(reversed(q), MAX_SAMPLES)][::-1] for p, q in self._ttft.items() if q}
        outcomes = {p: (self._errors.get(p, 0), len(q)) for p, q in self._outcomes.items() if q}
        in_flight = {name: pool.in_flight for name, pool in self._pools().items()}
        return Report(ttft, outcomes, in_flight)

    async def shared_tick(self, now: float | None = None) -> LadderState:
        """One tick of the shared ladder: publish this process's report; the leader decides on everyone's
        reports and writes the state, a follower adopts it. Raises on Redis errors (the caller falls back)."""
        assert self._sync is not None
        sync, now = self._sync, time.monotonic() if now is None else now
        before = set(self._ladder.state.names)
        local = self.signals(now)
        await sync.publish(self._report())
        lease = await sync.hold_lease()
        self.leader = lease > 0
        shared = await sync.read_state() if lease != 1 else None
        to_mono = {n: now - (time.time() - t) for n, t in (shared or {}).items()}
        if not self.leader:
            state = self._ladder.restore(to_mono)
        else:
            if shared is not None:  # just took over: continue from the shared entry times
                self._ladder.restore(to_mono)
            merged = {k: v for k, v in local.items() if k[0] in ("kv_cache_usage", "queue_depth")}
            state = self._ladder.update(self._idle_is_calm(merged | merge_reports(await sync.reports())), now)
            epoch = {n: time.time() - (now - t) for n, t in self._ladder.active_since().items()}
            self.leader = await sync.write_state(epoch)
        self._announce(before, state)
        return state

    def _announce(self, before: set[str], state: LadderState) -> None:
        for name in set(state.names) - before:
            log.warning("degradation step engaged", extra={"step": name, "active": list(state.names)})
        for name in before - set(state.names):
            log.info("degradation step released", extra={"step": name, "active": list(state.names)})
        if self._on_change is not None and before != set(state.names):
            self._on_change(set(state.names) - before, before - set(state.names))

    async def _loop(self) -> None:
        while not cancel_requested():  # redis-py may turn our cancellation into an error we catch below
            await asyncio.sleep(self._interval)
            try:
                if self._sync is None:
                    self.tick()
                    continue
                await self._tick_shared()
            except Exception:
                log.exception("degradation tick failed")

    async def _tick_shared(self) -> None:
        """`shared_tick`, or a local tick when Redis cannot be reached (said at most every warn_interval_s)."""
        try:
            await self.shared_tick()
        except REDIS_FAILURES as exc:
            ticks = self._unshared.due("shared")
            if ticks is not None:
                log.warning("shared ladder unavailable (%s); deciding locally, %d tick(s) since the last line",
                            exc, ticks)
            self.tick()
            return
        if self._unshared.forget(lambda key: True):
            log.info("shared ladder available again")

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="degradation")

    async def aclose(self) -> None:
        await stop(self._task)  # not a bare cancel: redis-py may swallow one mid-command (backends.background)
        self._task = None
