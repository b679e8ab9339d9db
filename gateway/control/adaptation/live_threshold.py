"""The live routing threshold of a `flagship_share` policy, shared by every worker through Redis.

Contract:
- Each scored `auto` request is noted (`observe`) in a local buffer: its score and whether it went to the
  routing's flagship pool. Nothing is written per request.
- A background task (`start`) calls `refresh` every `interval_s`: it pushes the buffer to the shared window
  (`ScoreWindow`: a capped Redis list, LPUSH + LTRIM, one pipelined round trip that also reads the window
  back), then sets the live threshold to the score that sends `flagship_share` of the window to the
  flagship (`router_models.training.calibrate.share_threshold`). Until the window holds `min_samples` scores, the
  policy's `initial` is used.
- Redis down: the last threshold stays, the buffer is kept (capped at the window), the failure is logged
  once, and the recovery once.
- `threshold(policy)` is what `policies.decide.decide` gets: None for a float-threshold policy. It is computed for
  the policy it is given from the window last read: after a reload, the first request routed on the new policy
  uses the new policy's share (or its fixed threshold), never a value computed for the policy before.
- `in_use(policy, ladder)` says what a score is compared with and where that came from (`policies.threshold.
  ThresholdInUse`: initial, share-held, ladder-raised): `/readyz` shows it under `routing` (`routing_state`, with a
  tiers policy's tradeoff in use beside it: `gateway.control.adaptation.live_tradeoff`), and
  `cascade policy explain --gateway` reads it there.

The realised flagship share is the share of the window's requests that went to the flagship pool (after
rules, tenant thresholds and the ladder), so it shows what routing did, not only what the quantile aimed at.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.control.adaptation.live_tradeoff import LiveTradeoff, tradeoff_in_use
from gateway.control.adaptation.shared_window import MemoryWindow, RedisWindow, ScoreWindow, WindowSync, window_key
from gateway.telemetry.metrics import GatewayMetrics
from policies.context import AUTO_MODEL, RouteContext
from policies.decide import RouteDecision
from policies.ladder import LadderState
from policies.loader import LoadedPolicy
from policies.schema import Policy
from policies.threshold import ShareThreshold, ThresholdInUse, base_threshold, share_target, threshold_in_use
from router_models.training.calibrate import share_threshold

__all__ = ["LiveThreshold", "MemoryWindow", "RedisWindow", "ScoreWindow", "ThresholdCollector", "WindowState",
           "routing_state", "start_live_threshold", "window_key", "window_state"]

@dataclass(frozen=True, slots=True)
class WindowState:
    """What the last refresh saw: the live threshold (None: not enough scores yet) and the window."""

    threshold: float | None = None
    samples: int = 0
    flagship_share: float | None = None


def _parse(entries: Iterable[str]) -> tuple[list[float], list[bool]]:
    scores, flagship = [], []
    for entry in entries:
        score, _, went = entry.partition("|")
        try:
            value = float(score)
        except ValueError:
            continue
        if 0 <= value <= 1:
            scores.append(value)
            flagship.append(went == "1")
    return scores, flagship


def window_state(target: ShareThreshold, entries: list[str]) -> WindowState:
    """The live threshold of `target` over the window's `entries` (`score|went`, newest first)."""
    scores, flagship = _parse(entries)
    if not scores:
        return WindowState()
    share = sum(flagship) / len(flagship)
    if len(scores) < target.min_samples:
        return WindowState(None, len(scores), share)
    value = round(share_threshold(scores, target.flagship_share).threshold, 6)
    return WindowState(value, len(scores), share)


class LiveThreshold(WindowSync):
    """Holds the live threshold of the current policy; `aclose` stops the refresh task."""

    TASK, WHAT, KEEPS = "live-threshold", "score window", "routing threshold"

    def __init__(self, window: ScoreWindow, policy: Callable[[], Policy], interval_s: float = 1.0) -> None:
        super().__init__(window, policy, interval_s)
        self._states: dict[ShareThreshold, WindowState] = {}  # by target: what `_entries` give each
        self._last: tuple[ShareThreshold, WindowState] | None = None  # the latest looked up

    @property
    def state(self) -> WindowState:
        """The window's state for the current policy."""
        target = share_target(self._policy().routing.threshold)
        return WindowState() if target is None else self._state_for(target)

    def _state_for(self, target: ShareThreshold) -> WindowState:
        last = self._last
        if last is not None and last[0] is target:  # the same policy object as the last request: no hashing
            return last[1]
        state = self._states.get(target)
        if state is None:  # a policy this window was not computed for (a reload): computed now, once
            if len(self._states) >= 4:
                self._states.clear()
            state = self._states[target] = window_state(target, self._entries)
        self._last = (target, state)
        return state

    def threshold(self, policy: Policy) -> float | None:
        """The routing threshold to decide with: None for a float policy, else the live value or `initial`."""
        target = share_target(policy.routing.threshold)
        if target is None:
            return None
        state = self._state_for(target)
        return target.initial if state.threshold is None or state.samples < target.min_samples else state.threshold

    def in_use(self, policy: Policy, ladder: LadderState | None = None) -> ThresholdInUse:
        """What a score is compared with under `policy` and `ladder`, and where it came from."""
        target = share_target(policy.routing.threshold)
        state = WindowState() if target is None else self._state_for(target)
        return threshold_in_use(policy.routing.threshold, state.threshold, state.samples,
                                ladder.threshold if ladder else None, ladder.threshold_step if ladder else None)

    def observe(self, policy: Policy, ctx: RouteContext, decision: RouteDecision) -> None:
        """Note a decided request (only scored `auto` requests under a share policy count)."""
        target = share_target(policy.routing.threshold)
        if target is None or decision.score is None or ctx.requested_model != AUTO_MODEL:
            return
        went = "1" if decision.pool == policy.routing.flagship_pool else "0"
        self._buffer.append(f"{decision.score:.6f}|{went}")
        if len(self._buffer) > target.window:
            del self._buffer[: len(self._buffer) - target.window]

    async def refresh(self) -> None:
        """Push the buffer, read the shared window back and recompute (see the module docstring)."""
        target = share_target(self._policy().routing.threshold)
        if target is None:
            self._buffer.clear()
            self._entries, self._states, self._last = [], {}, None
            return
        entries = await self._exchange(target.window,
                                       {"threshold": self._states.get(target, WindowState()).threshold})
        if entries is not None:
            self._entries, self._states, self._last = entries, {target: window_state(target, entries)}, None


class ThresholdCollector(Collector):
    """/metrics gauges: the routing threshold in use, and for a share policy its target and realised share. Each
    worker's own (it routes with what its last refresh computed): under `--workers` they carry a `worker` label
    (`gateway.telemetry.metrics`)."""

    def __init__(self, live: LiveThreshold, policy: Callable[[], Policy]) -> None:
        self._live, self._policy = live, policy

    def collect(self) -> Iterable[Metric]:
        policy = self._policy()
        in_use = self._live.threshold(policy)
        yield GaugeMetricFamily("cascade_routing_threshold", "routing threshold in use (live for a flagship_share "
                                "policy)", value=base_threshold(policy.routing.threshold) if in_use is None else in_use)
        target = share_target(policy.routing.threshold)
        if target is None:
            return
        state = self._live.state
        yield GaugeMetricFamily("cascade_routing_flagship_share_target", "flagship share the policy targets",
                                value=target.flagship_share)
        yield GaugeMetricFamily("cascade_routing_window_scores", "scores in the shared window", value=state.samples)
        if state.flagship_share is not None:
            yield GaugeMetricFamily("cascade_routing_flagship_share", "share of the window's scored auto requests "
                                    "that went to the flagship pool", value=state.flagship_share)


def start_live_threshold(client: aioredis.Redis | None, prefix: str, policy: Callable[[], Policy],
                         metrics: GatewayMetrics) -> LiveThreshold:
    """A started `LiveThreshold` on the Redis window (a process-local one without Redis), its gauges
    registered in `metrics`. The caller owns it (`aclose`)."""
    window: ScoreWindow = MemoryWindow() if client is None else RedisWindow(client, prefix)
    live = LiveThreshold(window, policy)
    metrics.register_scrape_time(ThresholdCollector(live, policy), own_view=True)  # per worker: its own refresh
    live.start()
    return live


def routing_state(live: LiveThreshold | None, loaded: LoadedPolicy, ladder: LadderState,
                  tradeoff: LiveTradeoff | None = None) -> dict[str, Any]:
    """What `/readyz` shows under `routing`: the policy version and the threshold it routes with, and why; for a
    tiers policy, `tradeoff`: the tradeoff its trades are made with, and why (`live_tradeoff.TradeoffInUse`)."""
    policy = loaded.policy
    in_use = (live.in_use(policy, ladder) if live is not None else
              threshold_in_use(policy.routing.threshold, None, 0, ladder.threshold, ladder.threshold_step))
    traded = tradeoff.in_use(policy) if tradeoff is not None else tradeoff_in_use(policy, ())
    return {"policy_version": loaded.version, "threshold": in_use.value, "source": in_use.source,
            "routing_threshold": in_use.routing, "routing_source": in_use.routing_source, "samples": in_use.samples,
            "ladder_step": in_use.ladder_step, "description": in_use.describe(),
            "tradeoff": None if traded is None else traded.public()}
