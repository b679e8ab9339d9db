"""Budget tests: the ledger's spend counters (exact, idempotent, through outbox replay, from two OS
processes) on the shared Redis (unique key prefix per test, deleted afterwards), `BudgetGuard` verdicts
at the exact boundary amounts, the reject error, the cache, and fail-open on an unreachable Redis."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from gateway.ledger.store import CostRecord, LedgerKeys, RedisLedger
from gateway.tenancy.budgets import BudgetGuard, StaticBudgets, evaluate
from policies.schema import Budget
from tests.conftest import SHARED_URL
from tests.gateway.ledger.test_ledger import replay_half_recorded
from tests.servers import free_port

JAN15 = 1_768_435_200.0  # 2026-01-15T00:00:00Z
REPO = Path(__file__).resolve().parents[3]
USD = 1_000_000  # micro-USD


def usd_budget(**values: object) -> Budget:
    """A `Budget` from YAML-like values (USD as decimal strings, parsed to integer micro-USD)."""
    return Budget.model_validate(values)


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def rec(i: int, cost: int, *, tenant: str = "acme", at: float = JAN15 + 3600.0) -> CostRecord:
    return CostRecord(
        request_id=f"req-{i}",
        tenant=tenant,
        pool="micro",
        model="tiny-llama",
        prompt_tokens=10,
        completion_tokens=5,
        cost_micro_usd=cost,
        flagship_cost_micro_usd=cost * 10,
        rule="default",
        policy_version="v1",
        started_at=at,
        ttft_ms=1.0,
        latency_ms=2.0,
    )




@pytest.fixture
async def client() -> AsyncIterator[aioredis.Redis]:
    conn = aioredis.Redis.from_url(SHARED_URL)
    yield conn
    await conn.aclose()


@pytest.fixture
async def ledger(tmp_path: Path, prefix: str) -> AsyncIterator[RedisLedger]:
    led = RedisLedger(SHARED_URL, tmp_path / "outbox", prefix, drain_interval_s=0.05, op_timeout_s=5.0)
    await led.start()
    yield led
    await led.aclose()


async def spend(client: aioredis.Redis, prefix: str, tenant: str, month: str) -> dict[str, int]:
    raw = await client.hgetall(LedgerKeys(prefix).spend(tenant, month))
    return {k.decode() if isinstance(k, bytes) else k: int(v) for k, v in raw.items()}


# --- spend counters written by the ledger -------------------------------------------------------------


@pytest.mark.redis
async def test_records_increment_day_and_month_spend_exactly(
    ledger: RedisLedger, client: aioredis.Redis, prefix: str
) -> None:
    days = [JAN15 + 60.0, JAN15 + 86_400.0 + 60.0, JAN15 + 20 * 86_400.0]  # Jan 15, Jan 16, Feb 4
    recs = [rec(i, 1_000 + i, tenant=f"t{i % 2}", at=days[i % 3]) for i in range(300)]
    await asyncio.gather(*(ledger.record(r) for r in recs))
    await asyncio.gather(*(ledger.record(r) for r in recs[:50]))  # retries: counted once
    assert ledger.counts.recorded == 300 and ledger.counts.duplicates == 50
    for tenant in ("t0", "t1"):
        want: dict[str, dict[str, int]] = {}
        for r in recs:
            if r.tenant == tenant:
                when = datetime.fromtimestamp(r.started_at, UTC)
                month = want.setdefault(f"{when:%Y-%m}", {"month": 0})
                month["month"] += r.cost_micro_usd
                month[f"{when:%Y-%m-%d}"] = month.get(f"{when:%Y-%m-%d}", 0) + r.cost_micro_usd
        for month_id, fields in want.items():
            assert await spend(client, prefix, tenant, month_id) == fields
    ttl = await client.ttl(LedgerKeys(prefix).spend("t0", "2026-01"))
    assert 35 * 86_400 + 31 * 86_400 - 60 < ttl <= 35 * 86_400 + 31 * 86_400


@pytest.mark.redis
async def test_outbox_replay_never_double_counts_spend(tmp_path: Path, client: aioredis.Redis, prefix: str) -> None:
    recs = [rec(i, 100_000 + i) for i in range(10)]
    await replay_half_recorded(tmp_path / "outbox", prefix, recs)
    total = sum(r.cost_micro_usd for r in recs)
    assert await spend(client, prefix, "acme", "2026-01") == {"month": total, "2026-01-15": total}


RECORDER = """
import asyncio, json, sys
from pathlib import Path
from gateway.ledger.store import CostRecord, RedisLedger

async def main(prefix: str, outbox: str, first: int, last: int) -> None:
    ledger = RedisLedger("redis://127.0.0.1:6379/0", Path(outbox), prefix, op_timeout_s=5.0)
    await ledger.start()
    recs = [
        CostRecord(f"req-{i}", "acme", "micro", "m", 10, 5, 1_000 + i, 9_000, "r", "v1", %(at)r, 1.0, 2.0)
        for i in range(first, last)
    ]
    await asyncio.gather(*(ledger.record(r) for r in recs))
    await ledger.aclose()
    counts = ledger.counts
    print(json.dumps({"recorded": counts.recorded, "duplicates": counts.duplicates, "spilled": counts.spilled}))

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
"""


def spawn(script: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, str(script), *args]
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.redis
async def test_two_processes_two_ledgers_share_one_budget(tmp_path: Path, client: aioredis.Redis, prefix: str) -> None:
    script = tmp_path / "recorder.py"
    script.write_text(RECORDER % {"at": JAN15 + 7200.0})
    # process A records ids 0..299, process B 200..499: ids 200..299 arrive twice and count once
    procs = [
        spawn(script, prefix, str(tmp_path / "a"), "0", "300"),
        spawn(script, prefix, str(tmp_path / "b"), "200", "500"),
    ]
    results = []
    for proc in procs:
        out, err = await asyncio.to_thread(proc.communicate, timeout=60)
        assert proc.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert sum(r["recorded"] for r in results) == 500 and sum(r["duplicates"] for r in results) == 100
    assert all(r["spilled"] == 0 for r in results)
    total = sum(1_000 + i for i in range(500))  # 624_750 micro-USD
    assert await spend(client, prefix, "acme", "2026-01") == {"month": total, "2026-01-15": total}
    guard = BudgetGuard(client, LedgerKeys(prefix), clock=FakeClock(JAN15 + 9000.0))
    assert (await guard.check("acme", usd_budget(daily_usd="0.624750"))).state == "exceeded"
    assert (await guard.check("acme", usd_budget(daily_usd="0.624751"))).state == "soft"


# --- BudgetGuard verdicts -----------------------------------------------------------------------------


@pytest.mark.redis
async def test_soft_and_exceeded_at_exact_amounts(ledger: RedisLedger, client: aioredis.Redis, prefix: str) -> None:
    guard = BudgetGuard(client, LedgerKeys(prefix), cache_s=0, clock=FakeClock(JAN15 + 7200.0))
    budget = usd_budget(daily_usd="1.00", soft_limit_pct=80)
    steps = [(799_999, "ok"), (1, "soft"), (199_999, "soft"), (1, "exceeded"), (5, "exceeded")]
    for i, (cost, state) in enumerate(steps):
        await ledger.record(rec(i, cost))
        verdict = await guard.check("acme", budget)
        assert verdict.state == state, (i, verdict)
    assert verdict.period == "day" and verdict.limit_micro_usd == USD and verdict.spent_micro_usd == USD + 5
    assert verdict.resets_at == datetime(2026, 1, 16, tzinfo=UTC) and verdict.retry_after_s == 86_400 - 7200
    assert verdict.reject and not verdict.downgrade
    assert guard.counts.reads == len(steps) and guard.counts.soft_warnings == 1


@pytest.mark.redis
async def test_monthly_exceeded_rejects_with_usd_message(
    ledger: RedisLedger, client: aioredis.Redis, prefix: str
) -> None:
    await ledger.record(rec(1, 30 * USD, at=JAN15 - 10 * 86_400.0))  # Jan 5: same month, another day
    await ledger.record(rec(2, 1_500_000))  # Jan 15
    guard = BudgetGuard(client, LedgerKeys(prefix), clock=FakeClock(JAN15 + 3600.0))
    verdict = await guard.check("acme", usd_budget(daily_usd="2.00", monthly_usd="31.50"))
    assert (verdict.state, verdict.period) == ("exceeded", "month")
    assert (verdict.day_spent_micro_usd, verdict.month_spent_micro_usd) == (1_500_000, 31_500_000)
    error = verdict.error("acme")
    assert (error.status, error.type, error.code) == (429, "insufficient_quota", "insufficient_quota")
    assert "spent 31.500000 USD" in error.message and "monthly budget of 31.500000 USD" in error.message
    assert "2026-02-01T00:00:00Z" in error.message
    assert error.retry_after_s == 17 * 86_400 - 3600  # to Feb 1, 00:00 UTC


@pytest.mark.redis
async def test_downgrade_vs_reject(ledger: RedisLedger, client: aioredis.Redis, prefix: str) -> None:
    await ledger.record(rec(1, 3 * USD))
    guard = BudgetGuard(client, LedgerKeys(prefix), clock=FakeClock(JAN15 + 7200.0))
    reject = await guard.check("acme", usd_budget(daily_usd="2.00"))
    downgrade = await guard.check("acme", usd_budget(daily_usd="2.00", on_exceed="downgrade"))
    assert (reject.reject, reject.downgrade) == (True, False)
    assert (downgrade.reject, downgrade.downgrade) == (False, True)
    assert guard.counts.reads == 1 and guard.counts.cached == 1  # spend cached, budget applied fresh
    ok = await guard.check("acme", usd_budget(daily_usd="10.00", on_exceed="downgrade"))
    assert (ok.state, ok.reject, ok.downgrade) == ("ok", False, False)


@pytest.mark.redis
async def test_cache_is_short_and_never_crosses_a_day(
    ledger: RedisLedger, client: aioredis.Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock(JAN15 + 7200.0)
    guard = BudgetGuard(client, LedgerKeys(prefix), cache_s=3600.0, clock=clock)
    budget = usd_budget(daily_usd="1.00", monthly_usd="100.00")
    await ledger.record(rec(1, 900_000))
    with caplog.at_level(logging.WARNING, logger="gateway.tenancy.budgets"):
        assert (await guard.check("acme", budget)).state == "soft"
        await ledger.record(rec(2, 200_000))
        assert (await guard.check("acme", budget)).state == "soft"  # stale by design (cache_s)
        clock.now = JAN15 + 86_400.0 + 60.0  # next UTC day: fresh read, new day, no spend yet
        await ledger.record(rec(3, 850_000, at=clock.now))
        verdict = await guard.check("acme", budget)
    assert (verdict.state, verdict.day_spent_micro_usd, verdict.month_spent_micro_usd) == ("soft", 850_000, 1_950_000)
    assert guard.counts.reads == 2 and guard.counts.cached == 1
    warnings = [r.getMessage() for r in caplog.records if "soft limit" in r.getMessage()]
    assert len(warnings) == 2 and "2026-01-15" in warnings[0] and "2026-01-16" in warnings[1]


@pytest.mark.redis
async def test_200_concurrent_checks_stay_under_the_client_pool(
    ledger: RedisLedger, client: aioredis.Redis, prefix: str
) -> None:
    await ledger.record(rec(1, 3 * USD))
    guard = BudgetGuard(client, LedgerKeys(prefix), cache_s=0, op_timeout_s=5.0, clock=FakeClock(JAN15 + 7200.0))
    budget = usd_budget(daily_usd="2.00")
    verdicts = await asyncio.gather(*(guard.check("acme", budget) for _ in range(200)))
    assert all(v.reject for v in verdicts)  # no MaxConnectionsError -> fail open past 100 connections
    assert guard.counts.reads == 200 and guard.counts.fail_open == 0


async def test_no_budget_means_no_redis_call() -> None:
    guard = BudgetGuard(aioredis.Redis(port=free_port()), LedgerKeys("x:"))
    verdict = await guard.check("acme", Budget())
    assert verdict.state == "ok" and not verdict.fail_open and guard.counts.fail_open == 0


async def test_fail_open_when_redis_unreachable(caplog: pytest.LogCaptureFixture) -> None:
    guard = BudgetGuard(aioredis.Redis(port=free_port()), LedgerKeys("x:"), retry_interval_s=60.0)
    began = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="gateway.tenancy.limits"):
        verdicts = [await guard.check("acme", usd_budget(daily_usd="0")) for _ in range(20)]
    assert time.monotonic() - began < 2.0, "an outage must not stall requests"
    assert all(v.state == "ok" and v.fail_open for v in verdicts) and guard.counts.fail_open == 20
    assert sum("budget guard" in r.getMessage() for r in caplog.records) == 1


# --- holds: the worst case of requests in flight -----------------------------------------------------------


async def held(client: aioredis.Redis, prefix: str, tenant: str = "acme") -> dict[str, int]:
    raw = await client.hgetall(LedgerKeys(prefix).holds(tenant))
    return {k.decode() if isinstance(k, bytes) else k: int(v) for k, v in raw.items()}


@pytest.mark.redis
async def test_concurrent_reserves_hold_the_budget_and_records_settle_them(
    ledger: RedisLedger, client: aioredis.Redis, prefix: str
) -> None:
    guard = BudgetGuard(client, LedgerKeys(prefix), op_timeout_s=5.0, clock=FakeClock(JAN15 + 3600.0))
    budget = usd_budget(daily_usd="0.002")
    verdicts = await asyncio.gather(*(guard.reserve("acme", budget, f"req-{i}", 500) for i in range(30)))
    placed = [i for i, v in enumerate(verdicts) if v.held]
    assert len(placed) == 4  # 0, 500, 1000, 1500 held: each below 2000; the fifth would see 2000
    assert all(v.reject and "0.002000 USD more held by requests in flight" in v.error("acme").message
               for v in verdicts if not v.held)
    assert await held(client, prefix) == {" sum": 2000, **{f"req-{i}": 500 for i in placed}}
    for i in placed[:3]:
        await ledger.record(rec(i, 450))  # the real cost is lower: the rest of each hold goes back
    await ledger.record(rec(placed[3], 450, tenant="other"))  # another tenant's id: releases nothing here
    assert await held(client, prefix) == {" sum": 500, f"req-{placed[3]}": 500}
    again = await guard.reserve("acme", budget, "req-next", 300)  # 1350 spent + 500 held < 2000
    assert again.held and again.state == "soft" and again.held_micro_usd == 500
    await guard.release("acme", "req-next")
    await guard.release("acme", "req-next")  # once only
    assert await held(client, prefix) == {" sum": 500, f"req-{placed[3]}": 500}


@pytest.mark.redis
async def test_an_abandoned_hold_expires(client: aioredis.Redis, prefix: str) -> None:
    guard = BudgetGuard(client, LedgerKeys(prefix), op_timeout_s=5.0, hold_ttl_s=0.3)
    budget = usd_budget(daily_usd="0.001")
    assert (await guard.reserve("acme", budget, "crashed", 1000)).held  # its process dies: nobody releases it
    assert (await guard.reserve("acme", budget, "next", 1000)).reject
    await asyncio.sleep(0.4)
    assert (await guard.reserve("acme", budget, "next", 1000)).held
    assert await held(client, prefix) == {" sum": 1000, "next": 1000}


async def test_reserve_fails_open_when_redis_unreachable() -> None:
    guard = BudgetGuard(aioredis.Redis(port=free_port()), LedgerKeys("x:"), retry_interval_s=60.0)
    verdict = await guard.reserve("acme", usd_budget(daily_usd="0"), "req-1", 10)
    assert verdict.state == "ok" and verdict.fail_open and not verdict.held
    await guard.release("acme", "req-1")  # never raises


# --- pure verdicts and the fake -------------------------------------------------------------------------


def test_evaluate_picks_the_worse_period_and_the_month_on_a_tie() -> None:
    budget = usd_budget(daily_usd="1.00", monthly_usd="10.00", soft_limit_pct=50)
    assert evaluate(budget, 600_000, 1_000_000, JAN15).period == "day"  # day soft, month ok
    assert evaluate(budget, 600_000, 6 * USD, JAN15).period == "month"  # both soft: month resets later
    both = evaluate(budget, 2 * USD, 10 * USD, JAN15)
    assert (both.state, both.period) == ("exceeded", "month")
    day_only = evaluate(budget, 2 * USD, 9 * USD, JAN15)
    assert (day_only.state, day_only.period) == ("exceeded", "day")
    assert evaluate(usd_budget(daily_usd="0"), 0, 0, JAN15).state == "exceeded"  # a zero budget allows nothing


def test_evaluate_month_reset_crosses_the_year() -> None:
    dec31 = datetime(2026, 12, 31, 23, 0, tzinfo=UTC).timestamp()
    verdict = evaluate(usd_budget(monthly_usd="1.00"), 0, USD, dec31)
    assert verdict.resets_at == datetime(2027, 1, 1, tzinfo=UTC) and verdict.retry_after_s == 3600
    with pytest.raises(ValueError):
        dataclasses.replace(verdict, period=None).error("acme")


async def test_static_fake_uses_the_same_rules() -> None:
    fake = StaticBudgets({"acme": (USD, 2 * USD)}, clock=FakeClock(JAN15))
    assert (await fake.check("acme", usd_budget(daily_usd="1.00", on_exceed="downgrade"))).downgrade
    assert (await fake.check("other", usd_budget(daily_usd="1.00"))).state == "ok"
