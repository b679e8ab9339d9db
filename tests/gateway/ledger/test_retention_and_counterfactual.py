"""Issue 5 audit: the stream's retention (records and idempotency keys) on the shared Redis, the flagship
counterfactual of a discarded cascade probe, and the report's tick and number formatting."""

from __future__ import annotations

import dataclasses
import time
from datetime import date
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from gateway.costs.html import _tick_labels
from gateway.costs.report import Cell, CostReport, Counters, display, verify
from gateway.costs.view import render_text
from gateway.ledger.store import LedgerKeys, MemoryLedger, RedisLedger
from gateway.serving.openai.usage import Usage
from gateway.serving.records.accounting import Accountant, RequestFacts
from policies.decide import RouteDecision
from policies.loader import load_policy
from tests.conftest import SHARED_URL, policy_yaml
from tests.gateway.ledger.test_ledger import DAY0, make_record

# --- retention ------------------------------------------------------------------------------------


@pytest.mark.redis
async def test_retention_trims_old_records_and_expires_idempotency_keys(tmp_path: Path, prefix: str) -> None:
    keys = LedgerKeys(prefix)
    client = aioredis.Redis.from_url(SHARED_URL)
    rec = make_record(1, started_at=time.time() - 60)
    stream = keys.stream(rec.tenant)
    try:
        old_ms = int(DAY0 * 1000)  # 2026-01-01: far older than a 2-day retention
        async with client.pipeline(transaction=False) as pipe:
            for i in range(1000):  # whole stream nodes of them, so that the approximate trim removes some
                pipe.xadd(stream, {"old": "1"}, id=f"{old_ms + i}-0")
            await pipe.execute()
        led = RedisLedger(SHARED_URL, tmp_path / "outbox", prefix, retention_days=2)
        await led.start()
        await led.record(rec)
        await led.aclose()
        remaining = await client.xlen(stream)
        assert remaining <= 1000 - 100 + 1, "records older than the retention are trimmed"
        [(_, fields)] = await client.xrevrange(stream, count=1) or []
        assert fields is not None and fields[b"request_id"] == rec.request_id.encode()
        for key in (keys.request(rec.tenant, rec.request_id), stream):  # a tenant that stops leaves no stream
            assert 2 * 86_400 - 60 < await client.ttl(key) <= 2 * 86_400
        result = await verify(client, keys, date(2026, 1, 1), date(2026, 1, 1))
        assert result.trimmed_through is not None, "verify says the range reaches into the trimmed part"
    finally:
        await client.aclose()


# --- the flagship counterfactual ------------------------------------------------------------------


def test_escalated_probe_adds_nothing_to_the_flagship_counterfactual(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(policy_yaml("http://127.0.0.1:1", "http://127.0.0.1:2"))
    policy = load_policy(path).policy  # micro 0.20/0.20, flagship 3.00/15.00 USD per Mtok
    accountant = Accountant(MemoryLedger())
    decision = RouteDecision("micro", "micro-model", 0.1, "score", "easy", "v1")
    facts = RequestFacts("r1", "acme", decision, DAY0, time.monotonic(), None, "ok")
    usage = Usage(1_000, 500)
    kept = accountant.cost_record(policy, facts, usage)
    assert (kept.cost_micro_usd, kept.flagship_cost_micro_usd) == (300, 3_000 + 7_500)
    probe = accountant.cost_record(policy, dataclasses.replace(facts, request_id="r1-probe", status="escalated"), usage)
    # with every request on the flagship, the probe would not exist: the flagship call carries the counterfactual
    assert (probe.cost_micro_usd, probe.flagship_cost_micro_usd) == (300, 0)


# --- formatting for people ------------------------------------------------------------------------


def test_axis_ticks_share_one_precision() -> None:
    assert _tick_labels(1_000_000) == ["$0.00", "$0.20", "$0.40", "$0.60", "$0.80", "$1.00"]
    assert _tick_labels(500) == ["$0.0000", "$0.0001", "$0.0002", "$0.0003", "$0.0004", "$0.0005"]
    assert _tick_labels(2_000_000_000)[-1] == "$2,000.00"
    assert _tick_labels(1)[-1] == "$0.000001"


def test_table_groups_thousands_but_keeps_exact_usd() -> None:
    assert [display(None), display(1_234_567), display("1.234567")] == ["-", "1,234,567", "1.234567"]
    cell = Cell("2026-01-01", "acme", "micro", "m", Counters(1_500, 2_962_570, 807_983, 6_080_703, 21_007_455))
    table = render_text(CostReport(date(2026, 1, 1), date(2026, 1, 1), (cell,)), "tenant", wide=True)
    total = next(line for line in table.splitlines() if line.startswith("TOTAL"))
    assert "1,500" in total and "2,962,570" in total and "3,770,553" in total
    assert "6.080703" in total and "21.007455" in total and "14.926752" in total
