"""The upgrade to the tenant-tagged key layout: records the version before wrote (one stream, global day
indexes, `spend:{tenant}:{month}`) still count in the cost report, `verify`, budgets, the stream readers
and the feedback owner check, beside records written now; a record the old layout counted and left in an
outbox is not counted again when the new version replays it."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from gateway.costs.report import load_report, stream_records, verify
from gateway.learning.store import LearningStore
from gateway.ledger.keys import RECORD_LUA
from gateway.ledger.layouts import LegacyLedgerKeys
from gateway.ledger.store import CostRecord, LedgerKeys, RedisLedger, rollup_slot
from gateway.tenancy.budgets import BudgetGuard
from policies.tenants import Budget
from tests.conftest import SHARED_URL
from tests.gateway.ledger.test_ledger import DAY0, make_record, spill, sums

STREAM_TTL = "redis.call('EXPIRE', KEYS[2], ARGV[1])\n"
# The record script as the version before ran it: the same script without the stream's TTL.
LEGACY_RECORD_LUA = RECORD_LUA.replace(STREAM_TTL, "")


async def write_legacy(client: aioredis.Redis, prefix: str, recs: list[CostRecord], tmp_path: Path) -> None:
    """Record `recs` as the version before did: its script, on its keys, with the arguments it passed."""
    assert LEGACY_RECORD_LUA != RECORD_LUA
    old = LegacyLedgerKeys(prefix)
    args_of = RedisLedger(SHARED_URL, tmp_path / "unused", prefix)._script_call  # same arguments as before
    for rec in recs:
        day, member, hour_member = rollup_slot(rec)
        keys = [old.request(rec.request_id), old.stream, old.day(day, member), old.hour(day, hour_member),
                old.day_index(day), old.hour_index(day), old.spend(rec.tenant, day[:7])]
        # budget holds (none held there) and spend per API key (the records carry no key id)
        keys += [f"{prefix}unused:holds", f"{prefix}unused:holds:exp", f"{prefix}unused:keys"]
        assert await client.eval(LEGACY_RECORD_LUA, len(keys), *keys, *args_of(rec)[1]) == 1


@pytest.mark.redis
async def test_records_of_the_layout_before_still_count_after_the_upgrade(tmp_path: Path, prefix: str) -> None:
    before = [make_record(i) for i in range(30)]  # 3 tenants, 2 UTC days
    after = [make_record(i) for i in range(30, 60)]  # the same tenants, pools, models and days: shared cells
    client = aioredis.Redis.from_url(SHARED_URL)
    try:
        await write_legacy(client, prefix, before, tmp_path)
        assert await client.exists(LegacyLedgerKeys(prefix).stream) == 1
        led = RedisLedger(SHARED_URL, tmp_path / "outbox", prefix)
        await led.start()
        for rec in after[:25]:
            await led.record(rec)
        await led.aclose()
        # left in the outbox by the old version: 3 it had counted, and 5 it had not
        await spill(tmp_path / "outbox", [*before[:3], *after[25:]])
        upgraded = RedisLedger(SHARED_URL, tmp_path / "outbox", prefix)
        await upgraded.start()  # replays the outbox before returning
        await upgraded.aclose()
        assert (upgraded.counts.replayed, upgraded.counts.duplicates) == (5, 3)

        everything = [*before, *after]
        keys = LedgerKeys(prefix)
        report = await load_report(client, keys, date(2026, 1, 1), date(2026, 1, 2))
        assert report.total().counters == sums(everything)
        cells = [(c.day, c.tenant, c.pool, c.model) for c in report.cells]
        assert len(set(cells)) == len(cells), "a rollup in both layouts is one cell"
        checked = await verify(client, keys, date(2026, 1, 1), date(2026, 1, 2))
        assert checked.ok and checked.records == 60, checked
        streamed = [rec async for _, rec in stream_records(client, keys, 0) if rec is not None]
        assert sorted(r.request_id for r in streamed) == sorted(r.request_id for r in everything)

        mine = [r for r in everything if r.tenant == "tenant-1"]
        guard = BudgetGuard(client, keys, cache_s=0, clock=lambda: DAY0 + 3600.0)
        verdict = await guard.check("tenant-1", Budget.model_validate({"monthly_usd": "1000"}))
        on_day1 = sum(r.cost_micro_usd for r in mine if r.started_at < DAY0 + 86_400)
        assert (verdict.day_spent_micro_usd, verdict.month_spent_micro_usd) == (
            on_day1, sum(r.cost_micro_usd for r in mine))

        store = LearningStore(client, prefix)
        old_one, new_one = next(r for r in before if r.tenant == "tenant-1"), mine[-1]
        assert await store.owned_by(old_one.request_id, "tenant-1") and await store.owned_by(new_one.request_id,
                                                                                              "tenant-1")
        assert not await store.owned_by(old_one.request_id, "tenant-2")
    finally:
        await client.aclose()
