"""The cost report split by endpoint (chat, Responses, completions, embeddings): records written through RedisLedger
to the shared Redis (unique key prefix, cleaned up), the rollups' endpoint counters read back, reconciled with the
stream, and rendered."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import redis

from gateway.costs.formats import render_json
from gateway.costs.report import CostReport, Counters, load_report, verify
from gateway.ledger.record import ENDPOINT_FIELDS, record_from_fields, record_to_fields
from gateway.ledger.store import CostRecord, LedgerKeys
from tests.conftest import SHARED_URL
from tests.gateway.costs.test_costs_report import DAY0, END, START, record_all
from tests.gateway.ledger.test_ledger import make_record

ENDPOINTS = ("chat", "responses", "completions", "embeddings")


def _records() -> list[CostRecord]:
    """90 requests over 2 days, every endpoint on both pools (endpoint and pool vary independently)."""
    return [make_record(i, started_at=DAY0 + 1800.0 * i + 1.0, endpoint=ENDPOINTS[(i // 4) % len(ENDPOINTS)])
            for i in range(90)]


def _base(recs: list[CostRecord]) -> Counters:
    """The requests, tokens and costs of `recs` (the fields the endpoint view splits)."""
    total = Counters()
    for rec in recs:
        total += Counters(1, rec.prompt_tokens, rec.completion_tokens, rec.cost_micro_usd,
                          rec.flagship_cost_micro_usd)
    return total


def _written(prefix: str, tmp_path: Path, recs: list[CostRecord]) -> tuple[CostReport, bool]:
    async def run() -> tuple[CostReport, bool]:
        await record_all(prefix, tmp_path / "outbox", recs)
        client = redis.asyncio.Redis.from_url(SHARED_URL)
        try:
            keys = LedgerKeys(prefix)
            return await load_report(client, keys, START, END), (await verify(client, keys, START, END)).ok
        finally:
            await client.aclose()

    return asyncio.run(run())


def test_the_report_splits_requests_tokens_and_cost_by_endpoint(prefix: str, tmp_path: Path) -> None:
    recs = _records()
    report, reconciled = _written(prefix, tmp_path, recs)
    assert reconciled  # the record script's endpoint counters match the ones recomputed from the stream
    rows = {row.key: row for row in report.rows("endpoint")}
    assert set(rows) == set(ENDPOINTS)
    for endpoint in ENDPOINTS:
        mine = [r for r in recs if r.endpoint == endpoint]
        assert rows[endpoint].counters == _base(mine), endpoint
        per_pool = {pool: sum(r.pool == pool for r in mine) for pool in ("flagship", "micro")}
        assert rows[endpoint].pool_requests == per_pool
    total = report.total().counters
    split = sum((row.counters for row in rows.values()), Counters())
    assert all(getattr(split, name) == getattr(total, name) for name in ENDPOINT_FIELDS)
    doc = json.loads(render_json(report, "endpoint"))
    assert [row["key"] for row in doc["rows"]] == sorted(rows, key=lambda k: -rows[k].counters.cost_micro_usd)


def test_a_chat_only_ledger_has_one_endpoint_row_and_an_old_record_reads_as_chat(prefix: str,
                                                                                  tmp_path: Path) -> None:
    fields = record_to_fields(make_record(3, endpoint="responses"))
    del fields["endpoint"]  # a record written before the field existed
    assert record_from_fields(fields) == make_record(3, endpoint="chat")
    recs = [make_record(i, started_at=DAY0 + 60.0 * i) for i in range(8)]
    report, _ = _written(prefix, tmp_path, recs)
    assert [(row.key, row.counters) for row in report.rows("endpoint")] == [("chat", _base(recs))]
