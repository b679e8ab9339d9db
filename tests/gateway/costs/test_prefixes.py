"""The prefixes an empty report names: found by their day registries on the shared Redis, latest first, and a
search cut by its time budget says so."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from gateway.costs.prefixes import LedgerPrefix, PrefixScan, ledger_prefixes
from tests.conftest import SHARED_URL
from tests.gateway.costs.test_costs_report import write_records
from tests.gateway.ledger.test_ledger import make_record


def _scan(budget_s: float) -> PrefixScan:
    async def run() -> PrefixScan:
        client = aioredis.Redis.from_url(SHARED_URL)
        try:
            return await ledger_prefixes(client, budget_s=budget_s, count=10)
        finally:
            await client.aclose()

    return asyncio.run(run())


@pytest.mark.redis
def test_a_prefix_with_records_is_found_with_its_days(prefix: str, tmp_path: Path) -> None:
    day = 86_400.0
    write_records(prefix, tmp_path / "outbox", [make_record(i, started_at=1_772_409_600.0 + day * (i % 3))
                                                for i in range(6)])  # 2026-03-02 .. 2026-03-04
    assert not _scan(0.0).complete  # a search past its budget says so (its first key already is)
    found = {p.prefix: p for p in _scan(30.0).found}
    assert found[prefix] == LedgerPrefix(prefix, "2026-03-02", "2026-03-04", 3)
    assert f"{prefix!r} (2026-03-02 .. 2026-03-04, outside the range read)" in PrefixScan((found[prefix],)).sentence(
        prefix)


def test_what_the_sentence_says_when_nothing_or_not_everything_was_searched() -> None:
    assert "holds no cost records under any prefix" in PrefixScan(()).sentence()
    assert "the search stopped early" in PrefixScan((), complete=False).sentence()
    many = tuple(LedgerPrefix(f"p{i}:", "2026-03-02", "2026-03-02", 1) for i in range(8))
    sentence = PrefixScan(many).sentence()
    assert "'p5:' (2026-03-02) and 2 more." in sentence and "'p6:'" not in sentence
