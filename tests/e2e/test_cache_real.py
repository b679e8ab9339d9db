"""The response cache end to end with real parts: the demo vLLM engines, the gateway as a separate process with
the trained classifier, the real Redis ledger, and the official openai SDK.

A second identical deterministic request is answered from the cache, streamed and not, with a ledger record of
cost 0; the semantic mode hits through the router's own embedding; the cost report shows the hit rate and the
avoided cost. Slow (engine start-up is minutes on 2 CPU cores): one gateway for the module.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from gateway.api.auth import hash_key
from gateway.costs.report import row_fields
from gateway.costs.view import render_text
from tests.conftest import delete_prefix, ledger_record, report_recent
from tests.engines import SharedEngines, demo_policy_text, gateway_on_shared_engines

pytestmark = [pytest.mark.engines, pytest.mark.redis]

TENANTS = f"""
tenants:
  exact:
    api_key_sha256: ['{hash_key("sk-exact")}']
    cache: {{mode: exact, ttl_s: 600}}
  semantic:
    api_key_sha256: ['{hash_key("sk-semantic")}']
    cache: {{mode: semantic, ttl_s: 600, min_similarity: 0.99}}
"""
PROMPT = "Write one sentence about lighthouses."


@pytest.fixture(scope="module")
def prefix() -> str:
    return f"test:e2e-cache:{uuid.uuid4().hex[:8]}:"


@pytest.fixture(scope="module")
def gateway(prefix: str, shared_engines: SharedEngines, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The demo engines (shared) behind a gateway with the trained classifier and two caching tenants."""
    policy = tmp_path_factory.mktemp("e2e-cache") / "policy.yaml"
    policy.write_text(demo_policy_text() + TENANTS)
    try:
        with gateway_on_shared_engines(shared_engines, policy, prefix) as served:
            yield served.url
    finally:
        delete_prefix(prefix)



def _ask(client: openai.OpenAI, model: str = "micro") -> Any:
    return client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": PROMPT}], max_tokens=12, temperature=0)


def _until_hit(client: openai.OpenAI, model: str = "micro") -> Any:
    deadline = time.monotonic() + 10  # the miss's answer is kept off the response path
    while (raw := _ask(client, model)).headers["x-cascade-cache"] != "hit":
        assert raw.headers["x-cascade-cache"] == "miss" and time.monotonic() < deadline
        time.sleep(0.1)
    return raw


def test_a_repeated_deterministic_request_is_a_cost_free_hit(gateway: str, prefix: str) -> None:
    client = openai.OpenAI(base_url=gateway + "/v1", api_key="sk-exact", max_retries=0)
    first = _ask(client)
    assert first.headers["x-cascade-cache"] == "miss"
    engine = first.parse()
    assert engine.model == "micro" and engine.usage is not None and engine.usage.completion_tokens > 0
    hit = _until_hit(client)
    assert hit.parse().choices[0].message.content == engine.choices[0].message.content
    with client.chat.completions.with_streaming_response.create(
        model="micro", messages=[{"role": "user", "content": PROMPT}], max_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True},
    ) as streamed:
        assert streamed.headers["x-cascade-cache"] == "hit"
        chunks = list(streamed.parse())
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == engine.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == engine.usage.completion_tokens

    miss = ledger_record(prefix, first.headers["x-request-id"])
    assert (miss["status"], miss["cache"], miss["usage_source"]) == ("ok", "miss", "engine")
    for raw in (hit, streamed):
        rec = ledger_record(prefix, raw.headers["x-request-id"])
        assert (rec["status"], rec["cache"], rec["pool"], rec["cost_micro_usd"]) == ("cache_hit", "hit", "micro", "0")
        assert rec["cache_avoided_micro_usd"] == miss["cost_micro_usd"] != "0"
        assert rec["flagship_cost_micro_usd"] == miss["flagship_cost_micro_usd"]

    report = asyncio.run(report_recent(prefix))
    (row,) = [r for r in report.rows("tenant") if r.key == "exact"]
    assert (row.counters.cache_hits, row.counters.cache_misses) == (2, 1)
    assert row.counters.cache_avoided_micro_usd == 2 * int(miss["cost_micro_usd"])
    fields = row_fields(row, report.pools)
    assert (fields["cache_hit_rate"], fields["cost_micro_usd"]) == ("66.7%", int(miss["cost_micro_usd"]))
    table = render_text(report, "tenant", wide=True)
    assert "cache hits" in table and "66.7%" in table
    print(table)


def test_the_semantic_cache_hits_through_the_routers_own_embedding(gateway: str, prefix: str) -> None:
    client = openai.OpenAI(base_url=gateway + "/v1", api_key="sk-semantic", max_retries=0)
    first = _ask(client, "auto")  # scored: the router embeds the prompt, the cache reads that vector
    assert first.headers["x-cascade-cache"] == "miss" and first.headers["x-cascade-scored-by"] == "primary"
    hit = _until_hit(client, "auto")
    assert float(hit.headers["x-cascade-cache-similarity"]) >= 0.99
    assert hit.parse().choices[0].message.content == first.parse().choices[0].message.content
    rec = ledger_record(prefix, hit.headers["x-request-id"])
    assert (rec["status"], rec["tenant"], rec["cost_micro_usd"]) == ("cache_hit", "semantic", "0")
    unlike = client.chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": "Prove that there are infinitely many primes."}],
        max_tokens=12, temperature=0)
    assert unlike.headers["x-cascade-cache"] == "miss"  # a prompt of another meaning is not answered from it
