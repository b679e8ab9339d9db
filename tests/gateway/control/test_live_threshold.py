"""The live threshold of a flagship_share policy: a fake window, then the real Redis with two workers."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Sequence

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.control.adaptation.live_threshold import LiveThreshold, MemoryWindow, RedisWindow, ThresholdCollector
from policies.context import RouteContext
from policies.decide import RouteDecision
from policies.loader import parse_policy
from policies.schema import Policy
from tests.conftest import SHARED_URL, policy_yaml

AUTO = RouteContext(tenant="t", requested_model="auto", prompt_text="q")


def _policy(threshold: str) -> Policy:
    text = policy_yaml("http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1")
    return parse_policy(text.replace("  threshold: 0.5\n", f"  threshold: {threshold}\n")).policy


SHARE = _policy("{flagship_share: 0.25, window: 100, min_samples: 20, initial: 0.9}")


def _decision(score: float | None, pool: str = "micro") -> RouteDecision:
    return RouteDecision(pool, "m", score, "threshold", "", "v")


def _feed(live: LiveThreshold, scores: Sequence[float], policy: Policy = SHARE) -> None:
    for s in scores:
        threshold = live.threshold(policy)
        assert threshold is not None
        live.observe(policy, AUTO, _decision(s, "flagship" if s >= threshold else "micro"))


class FlakyWindow(MemoryWindow):
    """A memory window whose Redis can be switched off."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False

    async def exchange(self, new: Sequence[str], keep: int) -> list[str]:
        if self.down:
            raise RedisConnectionError("connection refused")
        return await super().exchange(new, keep)


async def test_initial_until_min_samples_then_the_quantile() -> None:
    live = LiveThreshold(MemoryWindow(), lambda: SHARE)
    assert live.threshold(SHARE) == 0.9
    _feed(live, [i / 100 for i in range(10)])
    await live.refresh()
    assert live.threshold(SHARE) == 0.9 and live.state.samples == 10  # below min_samples
    _feed(live, [i / 100 for i in range(10, 100)])
    await live.refresh()
    value = live.threshold(SHARE)
    assert value is not None and 0.74 < value < 0.76  # 25 of the 100 scores 0.00..0.99 are >= 0.75
    assert live.state.samples == 100
    assert live.state.flagship_share == pytest.approx(0.1)  # what the initial 0.9 actually sent: 0.90..0.99


async def test_the_window_keeps_the_latest_scores_so_the_threshold_follows_drift() -> None:
    live = LiveThreshold(MemoryWindow(), lambda: SHARE)
    rng = random.Random(1)
    _feed(live, [rng.uniform(0, 0.5) for _ in range(100)])
    await live.refresh()
    low = live.threshold(SHARE)
    _feed(live, [rng.uniform(0.5, 1.0) for _ in range(100)])
    await live.refresh()
    high = live.threshold(SHARE)
    assert low is not None and high is not None
    assert 0.3 < low < 0.45 and 0.8 < high < 0.95


async def test_only_scored_auto_requests_of_a_share_policy_count() -> None:
    live = LiveThreshold(MemoryWindow(), lambda: SHARE)
    pinned = RouteContext(tenant="t", requested_model="micro", prompt_text="q")
    live.observe(SHARE, pinned, _decision(0.5))
    live.observe(SHARE, AUTO, _decision(None))
    fixed = _policy("0.4")
    live.observe(fixed, AUTO, _decision(0.5))
    await live.refresh()
    assert live.state.samples == 0
    assert live.threshold(fixed) is None  # a float policy decides with its own threshold


async def test_redis_down_keeps_the_last_threshold_logs_once_and_catches_up(
        caplog: pytest.LogCaptureFixture) -> None:
    window = FlakyWindow()
    live = LiveThreshold(window, lambda: SHARE)
    _feed(live, [i / 100 for i in range(100)])
    await live.refresh()
    before = live.threshold(SHARE)
    window.down = True
    _feed(live, [0.99] * 30)
    with caplog.at_level(logging.WARNING, logger="cascade.threshold"):
        await live.refresh()
        await live.refresh()
    assert live.threshold(SHARE) == before
    assert [r.message for r in caplog.records].count(
        "shared score window unavailable; keeping the last routing threshold") == 1
    window.down = False
    await live.refresh()
    after = live.threshold(SHARE)
    assert after is not None and before is not None and after > before  # the buffered 0.99s arrived


async def test_background_refresh_and_gauges() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    live = LiveThreshold(MemoryWindow(), lambda: SHARE, interval_s=0.01)
    registry = CollectorRegistry()
    registry.register(ThresholdCollector(live, lambda: SHARE))
    live.start()
    try:
        _feed(live, [i / 100 for i in range(100)])
        for _ in range(100):
            if live.state.samples == 100:
                break
            await asyncio.sleep(0.01)
    finally:
        await live.aclose()
    text = generate_latest(registry).decode()
    assert "cascade_routing_threshold 0.745" in text
    assert "cascade_routing_flagship_share_target 0.25" in text
    assert "cascade_routing_flagship_share 0.1" in text
    assert "cascade_routing_window_scores 100.0" in text


async def test_two_workers_share_one_window_in_redis(prefix: str) -> None:
    client = aioredis.Redis.from_url(SHARED_URL)
    try:
        first = LiveThreshold(RedisWindow(client, prefix), lambda: SHARE)
        second = LiveThreshold(RedisWindow(client, prefix), lambda: SHARE)
        _feed(first, [0.1 + i / 1000 for i in range(50)])  # worker 1 sees only low scores
        _feed(second, [0.8 + i / 1000 for i in range(50)])  # worker 2 only high ones
        await first.refresh()
        await second.refresh()
        await first.refresh()
        assert first.state.samples == second.state.samples == 100
        assert first.threshold(SHARE) == second.threshold(SHARE)
        value = first.threshold(SHARE)
        assert value is not None and 0.82 < value < 0.83  # the top 25 of all 100: alone, either worker is off
        _feed(first, [0.5] * 150)
        await first.refresh()
        assert await client.llen(f"{prefix}routing:recent-scores") == 100  # capped at the window
    finally:
        await client.aclose()


async def test_a_reload_switches_the_threshold_with_the_policy() -> None:
    current = [SHARE]
    live = LiveThreshold(MemoryWindow(), lambda: current[0])
    _feed(live, [i / 100 for i in range(100)])
    await live.refresh()
    assert live.threshold(SHARE) == pytest.approx(0.75, abs=0.02)
    tenth = _policy("{flagship_share: 0.1, window: 100, min_samples: 20, initial: 0.9}")
    current[0] = tenth  # a reload, with no refresh since: the first request on it uses its own share already
    assert live.threshold(tenth) == pytest.approx(0.9, abs=0.02)
    assert live.state.threshold == live.threshold(tenth)
    assert live.threshold(SHARE) == pytest.approx(0.75, abs=0.02)  # a request still in flight on the policy before
    assert live.threshold(_policy("0.4")) is None  # a fixed threshold: the policy's own


def test_where_the_threshold_in_use_came_from() -> None:
    from policies.ladder import LadderState

    live = LiveThreshold(MemoryWindow(), lambda: SHARE)
    fresh = live.in_use(SHARE)
    assert (fresh.value, fresh.source, fresh.samples) == (0.9, "initial", 0)
    fixed = live.in_use(_policy("0.4"), LadderState(threshold=0.6, threshold_step="kv-high"))
    assert (fixed.value, fixed.source, fixed.routing, fixed.routing_source) == (0.6, "ladder-raised", 0.4, "policy")
    assert "ladder step 'kv-high' raised the routing threshold 0.4" in fixed.describe()
    assert live.in_use(_policy("0.4"), LadderState(threshold=0.3, threshold_step="low")).source == "policy"


async def test_share_held_once_the_window_holds_min_samples() -> None:
    live = LiveThreshold(MemoryWindow(), lambda: SHARE)
    _feed(live, [i / 100 for i in range(100)])
    await live.refresh()
    held = live.in_use(SHARE)
    assert held.source == "share-held" and held.samples == 100 and held.value == live.threshold(SHARE)
    assert "held to the flagship share over the 100 latest scores" in held.describe()
