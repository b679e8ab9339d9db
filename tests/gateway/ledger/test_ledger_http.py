"""The gateway's cost records in the real Redis ledger: exact under concurrency, and a client that leaves
mid-stream is charged for what was generated."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import orjson
import pytest
import redis

from loadtest.fake_upstream import FakeUpstream
from loadtest.scenarios.chaos_figures import ledger_records
from tests.conftest import SHARED_URL, GatewayFactory, verify_recent

pytestmark = pytest.mark.redis


@pytest.fixture
def gateway(make_gateway: GatewayFactory, policy_file: Path, prefix: str) -> str:
    """Served (uvicorn, engines on ports): concurrent clients, and one that leaves while tokens arrive."""
    return make_gateway(policy_file, served=True, scorer="none", ledger="redis", redis_prefix=prefix).url


def _records(prefix: str, n: int, timeout: float = 10.0) -> list[dict[str, str]]:
    deadline = time.monotonic() + timeout
    while True:
        entries = ledger_records(SHARED_URL, prefix)
        if len(entries) >= n or time.monotonic() > deadline:
            return entries
        time.sleep(0.05)


async def test_concurrent_requests_record_exactly_their_usage(gateway: str, prefix: str) -> None:
    async with httpx.AsyncClient(timeout=30) as client:
        async def one(i: int) -> tuple[str, str, int, int]:
            body = {"model": "micro" if i % 2 else "flagship", "stream": i % 3 == 0,
                    "messages": [{"role": "user", "content": "w " * (i % 7)}],
                    "max_tokens": 1 + i % 9, "stream_options": {"include_usage": True}}
            r = await client.post(gateway + "/v1/chat/completions", json=body)
            assert r.status_code == 200
            if i % 3 == 0:
                usage = [line for line in r.text.splitlines() if '"usage":{' in line][-1]
                u = httpx.Response(200, content=usage[6:]).json()["usage"]
            else:
                u = r.json()["usage"]
            return r.headers["x-request-id"], r.headers["x-cascade-pool"], u["prompt_tokens"], u["completion_tokens"]

        usages = await asyncio.gather(*(one(i) for i in range(200)))
    records = await asyncio.to_thread(_records, prefix, 200)
    assert len(records) == 200
    # each request exactly once, with the usage its client saw, priced in integer micro-USD (tests.conftest)
    prices = {"micro": (200_000, 200_000), "flagship": (3_000_000, 15_000_000)}

    def cost(pool: str, prompt: int, completion: int) -> int:
        return (prompt * prices[pool][0] + completion * prices[pool][1] + 500_000) // 1_000_000

    by_id = {r["request_id"]: r for r in records}
    for request_id, pool, prompt, completion in usages:
        rec = by_id[request_id]
        assert (rec["pool"], int(rec["prompt_tokens"]), int(rec["completion_tokens"])) == (pool, prompt, completion)
        assert int(rec["cost_micro_usd"]) == cost(pool, prompt, completion)
        assert int(rec["flagship_cost_micro_usd"]) == cost("flagship", prompt, completion)
    day = redis.Redis.from_url(SHARED_URL, decode_responses=True)
    rollups = [day.hgetall(k) for k in day.scan_iter(match=prefix + "ledger:{*}:day:*")]
    assert sum(int(h["completion_tokens"]) for h in rollups) == sum(u[3] for u in usages)
    assert sum(int(h["prompt_tokens"]) for h in rollups) == sum(u[2] for u in usages)
    assert sum(int(h["cost_micro_usd"]) for h in rollups) == sum(cost(*u[1:]) for u in usages)
    assert sum(int(h["requests"]) for h in rollups) == 200
    result = await verify_recent(prefix)
    assert result.ok and result.records == 200, result


async def test_client_gone_mid_stream_is_charged_in_redis(gateway: str, prefix: str,
                                                          upstreams: tuple[FakeUpstream, str, FakeUpstream, str]
                                                          ) -> None:
    """A 4-character token every 0.3 s, the client gone after the fourth: Redis holds a charge for exactly
    the four tokens it was sent, priced at the flagship's rates."""
    upstreams[2].content = "wxyz" * 50
    body = {"model": "flagship", "messages": [{"role": "user", "content": "one two three"}], "stream": True,
            "metadata": {"fake_delay_ms": "300"}}
    received: list[str] = []
    async with httpx.AsyncClient() as client, client.stream("POST", gateway + "/v1/chat/completions",
                                                             json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                received += [c["delta"]["content"] for c in orjson.loads(line[6:])["choices"]
                             if c["delta"].get("content")]
            if len(received) >= 4:
                break
    (rec,) = await asyncio.to_thread(_records, prefix, 1)
    assert rec["status"] == "client_disconnect" and rec["usage_source"] == "estimate"  # a remote pool: not re-sent
    assert received == ["wxyz"] * 4
    assert (int(rec["prompt_tokens"]), int(rec["completion_tokens"])) == (3, 4)  # 13 characters; 4 tokens sent
    assert int(rec["cost_micro_usd"]) == (3 * 3_000_000 + 4 * 15_000_000 + 500_000) // 1_000_000
