"""An embedding tenant's budget through the gateway in-process and the real Redis ledger: each request holds the
worst case of its input (`Admission.admit_input`), so a tenant sending until refused ends within its budget, and
its spend shows as the `embeddings` row of the cost report by endpoint."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gateway.api.auth import hash_key
from loadtest.fake_upstream import FakeUpstream
from tests.conftest import Upstreams, report_recent
from tests.gateway.serving.test_embeddings_http import embedding_policy
from tests.gateway.tenancy.test_admission_http import redis_gateway
from tests.harness import FakeEngines
from tests.servers import until

pytestmark = pytest.mark.redis
PRICE = 100  # micro-USD per input token ("100.00" USD per million)
BUDGET = 5_000  # micro-USD a day
TEXT = "seven words of text to embed here"  # the fake counts 7 tokens; 33 bytes: at most 35 tokens held
WORST = 2 * 35 * PRICE  # what a request of two such inputs holds


def test_an_embedding_tenant_ends_within_its_budget_and_its_spend_is_an_endpoint_row(
        tmp_path: Path, fake_engines: FakeEngines, fake_upstreams: Upstreams) -> None:
    engine = FakeUpstream("embed-model")
    url = fake_engines.add("embed", engine)
    tenants = f"""tenants:
  vectors: {{api_key_sha256: ['{hash_key("sk-v")}'], budget: {{daily_usd: "{BUDGET / 1e6:.6f}"}},
             on_redis_outage: fail_closed}}
"""
    policy = embedding_policy(fake_upstreams, url, extra=tenants).replace('input_per_mtok: "0.02"',
                                                                            'input_per_mtok: "100.00"')
    with redis_gateway(tmp_path, policy, fake_engines) as (gateway, prefix):

        def post(_: object) -> int:
            response = gateway.client.post("/v1/embeddings", json={"model": "embed", "input": [TEXT, TEXT]},
                                           headers={"authorization": "Bearer sk-v"}, timeout=60)
            if response.status_code == 429:
                assert response.json()["error"]["code"] == "insufficient_quota", response.text
            return response.status_code

        def recorded() -> int:
            rows = {row.key: row.counters for row in asyncio.run(report_recent(prefix)).rows("endpoint")}
            return rows["embeddings"].requests if "embeddings" in rows else 0

        # a burst: each admitted request holds its worst case, so the budget stops the rest before they are billed
        with ThreadPoolExecutor(12) as pool:
            codes = list(pool.map(post, range(12)))
        for _ in range(8):  # then one at a time, each once the last is recorded (its hold released), until refused
            served = codes.count(200)
            until(lambda: recorded() == served, 10)  # noqa: B023 (called at once)
            codes.append(post(None))
            if codes[-1] == 429:
                break
        served = codes.count(200)
        assert set(codes) <= {200, 429, 503} and served >= 2 and codes[-1] == 429, codes
        spent = served * 2 * 7 * PRICE
        assert spent <= BUDGET + WORST, (spent, codes)  # the budget's bound: one request's worst case past it
        until(lambda: recorded() == served, 10)
        rows = {row.key: row.counters for row in asyncio.run(report_recent(prefix)).rows("endpoint")}
        assert set(rows) == {"embeddings"}
        row = rows["embeddings"]
        assert (row.prompt_tokens, row.completion_tokens, row.cost_micro_usd) == (served * 14, 0, spent)
        assert row.flagship_cost_micro_usd == spent  # no savings claimed


def test_a_budget_that_downgrades_refuses_embeddings_once_spent(
        tmp_path: Path, fake_engines: FakeEngines, fake_upstreams: Upstreams) -> None:
    url = fake_engines.add("embed", FakeUpstream("embed-model"))
    tenants = f"""tenants:
  vectors: {{api_key_sha256: ['{hash_key("sk-v")}'], budget: {{daily_usd: "0.0001", on_exceed: downgrade}}}}
"""
    policy = embedding_policy(fake_upstreams, url, extra=tenants).replace('input_per_mtok: "0.02"',
                                                                            'input_per_mtok: "100.00"')
    with redis_gateway(tmp_path, policy, fake_engines) as (gateway, prefix):

        def post() -> int:
            return gateway.client.post("/v1/embeddings", json={"model": "embed", "input": TEXT},
                                       headers={"authorization": "Bearer sk-v"}).status_code

        assert post() == 200  # 700 micro-USD of a 100 budget: spent past it
        until(lambda: asyncio.run(report_recent(prefix)).total().counters.requests == 1, 10)
        refused = gateway.client.post("/v1/embeddings", json={"model": "embed", "input": TEXT},
                                      headers={"authorization": "Bearer sk-v"})
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "insufficient_quota", refused.text
        chat = gateway.client.post("/v1/chat/completions", headers={"authorization": "Bearer sk-v"}, json={
            "model": "flagship", "messages": [{"role": "user", "content": "hi"}]})
        assert chat.status_code == 200 and chat.headers["x-cascade-pool"] == "micro"  # chat is downgraded instead
