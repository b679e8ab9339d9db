"""An API key's daily budget is held like its tenant's: concurrent requests of one key see each other's holds in
one atomic step (`gateway.ledger.holds`), the ledger's record of a request releases its key's hold as it adds the
cost, and a request refused later gives it back. Real Redis, unique prefix per test."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from gateway.errors import BudgetExceeded, NoReplicaAvailable
from gateway.ledger.store import LedgerKeys, RedisLedger
from gateway.telemetry.metrics import GatewayMetrics
from gateway.tenancy.admission import Admission
from gateway.tenancy.api_keys import ApiKey
from gateway.tenancy.budgets import BudgetGuard
from tests.conftest import SHARED_URL
from tests.gateway.tenancy.test_admission import MESSAGES, POLICY, REQUEST
from tests.gateway.tenancy.test_budgets import rec

pytestmark = pytest.mark.redis
WORST = 102  # REQUEST's worst case: 2 + 1 tokens at the flagship's prices (test_admission)
KEY = ApiKey("0123456789ab", "open", daily_usd=4 * WORST)
OPEN = POLICY.model_copy(update={"tenants": {"open": POLICY.tenants["acme"].model_copy(
    update={"budget": POLICY.tenants["acme"].budget.model_copy(update={"daily_usd": None})})}})


@pytest.fixture
async def client() -> AsyncIterator[aioredis.Redis]:
    conn = aioredis.Redis.from_url(SHARED_URL, decode_responses=True)
    yield conn
    await conn.aclose()


def _admission(client: aioredis.Redis, prefix: str) -> Admission:
    guard = BudgetGuard(client, LedgerKeys(prefix))
    return Admission(None, guard, GatewayMetrics(dict), key_budget=guard)


async def test_concurrent_requests_of_one_key_stop_at_its_budget(client: aioredis.Redis, prefix: str) -> None:
    admission = _admission(client, prefix)
    results = await asyncio.gather(*(admission.admit(OPEN, "open", REQUEST, MESSAGES, f"req-{i}", KEY)
                                     for i in range(30)), return_exceptions=True)
    refused = [r for r in results if isinstance(r, BudgetExceeded)]
    assert len(refused) == 26 and len(results) - len(refused) == 4, results  # four worst cases fill the budget
    assert f"API key '{KEY.id}' of tenant 'open'" in refused[0].message and "held by requests" in refused[0].message
    held = await client.hgetall(LedgerKeys(prefix).key_holds("open", KEY.id))
    assert held.pop(" sum") == str(4 * WORST) and len(held) == 4


async def test_the_record_releases_the_keys_hold_and_a_refusal_gives_it_back(
        client: aioredis.Redis, prefix: str, tmp_path: Path) -> None:
    admission = _admission(client, prefix)
    keys = LedgerKeys(prefix)
    ledger = RedisLedger(SHARED_URL, tmp_path / "outbox", prefix, drain_interval_s=0.05, op_timeout_s=5.0)
    await ledger.start()
    try:
        await admission.admit(OPEN, "open", REQUEST, MESSAGES, "req-1", KEY)
        with pytest.raises(NoReplicaAvailable):
            async with admission.refunds("req-2"):
                await admission.admit(OPEN, "open", REQUEST, MESSAGES, "req-2", KEY)
                raise NoReplicaAvailable("no replica")
        assert set(await client.hgetall(keys.key_holds("open", KEY.id))) == {" sum", "req-1"}
        await ledger.record(dataclasses.replace(rec(1, 40, tenant="open", at=time.time()), key_id=KEY.id))
        assert await client.hgetall(keys.key_holds("open", KEY.id)) == {" sum": "0"}
    finally:
        await ledger.aclose()
