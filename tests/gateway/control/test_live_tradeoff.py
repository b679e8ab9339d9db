"""The live tradeoff of a cost_per_1k tiers policy: two workers on the shared Redis window hold one tradeoff that
keeps the window's mean expected cost at the target; until the window fills, each request on its own; Redis down
keeps the last tradeoff."""

from __future__ import annotations

import random
from collections.abc import Sequence

import redis.asyncio as aioredis

from gateway.control.adaptation.live_tradeoff import MIN_SAMPLES, LiveTradeoff, TradeoffCollector, entry_of, parse_entry
from gateway.control.adaptation.shared_window import MemoryWindow, RedisWindow
from policies.tiers import TierEstimate, choose
from tests.conftest import SHARED_URL
from tests.gateway.control.test_live_threshold import FlakyWindow
from tests.policies.test_tiers import _policy

HELD = _policy("tiers: [general, code, flagship]\n  cost_per_1k: '2.00'").policy
FIXED = _policy("tiers: [general, code, flagship]\n  tradeoff: 7").policy


def _rows(n: int, seed: int) -> list[tuple[TierEstimate, ...]]:
    """Made-up predictions (they exercise the control loop, not routing quality)."""
    rng = random.Random(seed)
    return [(TierEstimate("general", rng.uniform(0.2, 0.8), 0.00006), TierEstimate("code", rng.uniform(0.4, 0.9),
             0.0003), TierEstimate("flagship", rng.uniform(0.85, 1.0), 0.008)) for _ in range(n)]


def _mean_per_1k(rows: Sequence[Sequence[TierEstimate]], tradeoff: float) -> float:
    return sum(choose(row, tradeoff).cost_usd for row in rows) / len(rows) * 1000


def test_an_entry_round_trips_and_other_tiers_are_skipped() -> None:
    row = _rows(1, 0)[0]
    back = parse_entry(entry_of(row), ("general", "code", "flagship"))
    assert back is not None and [e.pool for e in back] == ["general", "code", "flagship"]
    assert all(abs(a.quality - b.quality) < 1e-5 and abs(a.cost_usd - b.cost_usd) < 1e-9
               for a, b in zip(row, back, strict=True))
    assert parse_entry(entry_of(row), ("general", "flagship")) is None
    assert parse_entry("general:x:1", ("general",)) is None


async def test_before_the_window_fills_each_request_gets_the_best_quality_within_the_target() -> None:
    live = LiveTradeoff(MemoryWindow(), lambda: HELD)
    row = (TierEstimate("general", 0.5, 0.00006), TierEstimate("code", 0.7, 0.0003),
           TierEstimate("flagship", 0.95, 0.008))
    assert choose(row, live.tradeoff(HELD, row)).pool == "code"  # $0.30 per 1k is within $2; $8 is not
    assert live.tradeoff(FIXED, row) == 7  # a tradeoff policy: its own


async def test_two_workers_share_one_window_and_hold_the_target(prefix: str) -> None:
    client = aioredis.Redis.from_url(SHARED_URL)
    try:
        key = f"{prefix}routing:recent-trades"
        first = LiveTradeoff(RedisWindow(client, prefix, key), lambda: HELD)
        second = LiveTradeoff(RedisWindow(client, prefix, key), lambda: HELD)
        rows = _rows(300, 1)
        for i, row in enumerate(rows):
            (first if i % 2 else second).observe(HELD, row)
        await first.refresh()
        await second.refresh()
        await first.refresh()
        assert first.samples == second.samples == 300 >= MIN_SAMPLES
        assert first.tradeoff(HELD, rows[0]) == second.tradeoff(HELD, rows[0])
        tradeoff = first.tradeoff(HELD, rows[0])
        assert _mean_per_1k(rows, 0) > 2.0  # the best quality alone would overspend: the target binds
        assert 1.9 < _mean_per_1k(rows, tradeoff) <= 2.0  # held, not undershot by much
        assert {choose(row, tradeoff).pool for row in rows} == {"general", "code", "flagship"}
    finally:
        await client.aclose()


async def test_the_gauges_show_the_target_the_window_and_the_tradeoff_in_force() -> None:
    live = LiveTradeoff(MemoryWindow(), lambda: HELD)

    def gauges() -> dict[str, float]:
        return {m.name: m.samples[0].value for m in TradeoffCollector(live, lambda: HELD).collect()}

    assert gauges() == {"cascade_routing_cost_per_1k_target_usd": 2.0, "cascade_routing_trade_window": 0}
    for row in _rows(100, 4):
        live.observe(HELD, row)
    await live.refresh()
    assert gauges()["cascade_routing_trade_window"] == 100
    assert gauges()["cascade_routing_tradeoff"] == live.live and live.live is not None and live.live > 0
    assert list(TradeoffCollector(live, lambda: FIXED).collect()) == []  # a tradeoff policy: nothing live


async def test_redis_down_keeps_the_last_tradeoff_and_catches_up() -> None:
    window = FlakyWindow()
    live = LiveTradeoff(window, lambda: HELD)
    rows = _rows(200, 2)
    for row in rows:
        live.observe(HELD, row)
    await live.refresh()
    held = live.tradeoff(HELD, rows[0])
    window.down = True
    for row in _rows(100, 3):
        live.observe(HELD, row)
    await live.refresh()
    assert live.tradeoff(HELD, rows[0]) == held and live.samples == 200
    window.down = False
    await live.refresh()
    assert live.samples == 300  # the buffer kept while Redis was down reaches the window


async def test_a_reload_switches_the_tradeoff_with_the_policy() -> None:
    current = [HELD]
    live = LiveTradeoff(MemoryWindow(), lambda: current[0])
    rows = _rows(300, 5)
    for row in rows:
        live.observe(HELD, row)
    await live.refresh()
    held = live.tradeoff(HELD, rows[0])
    assert 1.9 < _mean_per_1k(rows, held) <= 2.0
    tighter = _policy("tiers: [general, code, flagship]\n  cost_per_1k: '0.50'").policy
    current[0] = tighter  # a reload, with no refresh since: the first request on it is traded for its own target
    now = live.tradeoff(tighter, rows[0])
    assert now > held and 0.45 < _mean_per_1k(rows, now) <= 0.5
    in_use = live.in_use(tighter)
    assert in_use is not None and (in_use.value, in_use.source, in_use.samples) == (now, "window-held", 300)
    assert live.live == now and live.tradeoff(HELD, rows[0]) == held  # a request still in flight on the policy before
    other = _policy("tiers: [general, flagship]\n  cost_per_1k: '0.50'").policy  # other tiers: the window has none
    alone = live.in_use(other)
    assert alone is not None and (alone.value, alone.source, alone.samples) == (None, "per-request", 0)
    row = (TierEstimate("general", 0.5, 0.00006), TierEstimate("flagship", 0.95, 0.008))
    assert choose(row, live.tradeoff(other, row)).pool == "general"  # solved on the request: $8 per 1k is over
    fixed = live.in_use(FIXED)
    assert fixed is not None and (fixed.value, fixed.source) == (7, "policy")
