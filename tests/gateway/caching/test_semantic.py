"""The semantic response cache on real Redis, with a scorer fake that hands out chosen embeddings: the nearest kept
prompt answers above the tenant's threshold, within the same context, model and tenant only; what the router kept
no vector for is bypassed; a policy with a bad cache block is refused with its file and line."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
import pytest
import pytest_asyncio
import redis.asyncio as aioredis

from gateway.api.auth import hash_key
from gateway.caching.answer_cache import AnswerCache, CacheLookup
from gateway.caching.keys import CacheKeys
from gateway.caching.store import RedisCacheStore
from gateway.ledger.store import MemoryLedger
from gateway.serving.openai.schema import parse_chat_request
from gateway.serving.records.accounting import Accountant, RequestFacts
from gateway.serving.routing.router import RequestRouter
from gateway.serving.sending.forwarding import JSONReply
from gateway.telemetry.metrics import GatewayMetrics
from policies.decide import RouteDecision
from policies.loader import PolicyError, parse_policy
from router_models.serving.scorer import ConversationShape, conversation_text
from tests.conftest import SHARED_URL, policy_yaml

pytestmark = pytest.mark.redis

SPACE = "all-MiniLM-L6-v2:onnx-int8:t64:l3"
POLICY = parse_policy(policy_yaml("http://127.0.0.1:9", "http://127.0.0.1:9") + f"""tenants:
  a:
    api_key_sha256: ['{hash_key("a")}']
    cache: {{mode: semantic, ttl_s: 60, min_similarity: 0.9, max_entries: 3}}
  b:
    api_key_sha256: ['{hash_key("b")}']
    cache: {{mode: semantic, ttl_s: 60, min_similarity: 0.9}}
""").policy


class VectorScorer:
    """`Scorer` + `EmbeddingSource` fake: the vector of each text is the test's choice."""

    version = "fake"
    embedding_space = SPACE

    def __init__(self) -> None:
        self.vectors: dict[str, npt.NDArray[np.float32]] = {}

    async def score(self, texts: Sequence[str]) -> list[float]:
        return [0.1] * len(texts)

    async def score_one(self, text: str, shape: ConversationShape | None = None) -> tuple[float, str]:
        return 0.1, "primary"

    def embedding(self, text: str) -> npt.NDArray[np.float32] | None:
        return self.vectors.get(text)

    async def aclose(self) -> None:
        return None


def _unit(*values: float) -> npt.NDArray[np.float32]:
    v = np.zeros(384, dtype=np.float32)
    v[: len(values)] = values
    return v


@pytest_asyncio.fixture
async def setup(prefix: str) -> AsyncIterator[tuple[AnswerCache, VectorScorer, MemoryLedger, Accountant]]:
    client = aioredis.Redis.from_url(SHARED_URL)
    scorer, metrics, ledger = VectorScorer(), GatewayMetrics(dict), MemoryLedger()
    accountant = Accountant(ledger, metrics)
    cache = AnswerCache(RedisCacheStore(client), CacheKeys(prefix), RequestRouter(scorer, metrics), accountant, metrics)
    yield cache, scorer, ledger, accountant
    await client.aclose()


def _request(text: str, system: str = "Be brief.") -> tuple[Any, dict[str, Any]]:
    body = {"model": "auto", "temperature": 0, "messages": [{"role": "system", "content": system},
                                                             {"role": "user", "content": text}]}
    return parse_chat_request(orjson.dumps(body))


def _facts(tenant: str, request_id: str, model: str = "micro-model") -> RequestFacts:
    decision = RouteDecision("micro", model, 0.1, "threshold", "test", "v1", "primary")
    return RequestFacts(request_id, tenant, decision, time.time(), time.monotonic(), None, "ok")


ANSWER = {"id": "e", "object": "chat.completion", "model": "micro-model",
          "choices": [{"index": 0, "message": {"role": "assistant", "content": "Paris."}, "finish_reason": "stop"}],
          "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}}


async def _ask(cache: AnswerCache, accountant: Accountant, tenant: str, text: str, n: int,
               **kw: Any) -> CacheLookup:
    request, raw = _request(text, **{k: v for k, v in kw.items() if k == "system"})
    facts = _facts(tenant, f"req-{tenant}-{n}", kw.get("model", "micro-model"))
    lookup = await cache.lookup(POLICY, facts, request, raw)
    if lookup.result == "miss":
        lookup.keep(JSONReply(orjson.dumps(ANSWER), facts.decision))
        await accountant.drain()
    return lookup


async def test_the_nearest_prompt_answers_above_the_threshold_only(setup: Any) -> None:
    cache, scorer, ledger, accountant = setup
    texts = {"What is the capital of France?": _unit(1, 0), "what's france's capital?": _unit(0.98, 0.2),
             "What is the capital of Spain?": _unit(0.8, 0.6)}
    for text, vector in texts.items():
        scorer.vectors[conversation_text(_request(text)[1]["messages"])] = vector
    assert (await _ask(cache, accountant, "a", "What is the capital of France?", 1)).result == "miss"
    near = await _ask(cache, accountant, "a", "what's france's capital?", 2)
    assert near.result == "hit" and isinstance(near.reply, JSONReply)
    assert 0.97 < float(near.reply.headers["x-cascade-cache-similarity"]) < 0.99
    assert orjson.loads(near.reply.body)["choices"][0]["message"]["content"] == "Paris."
    await accountant.drain()
    rec = ledger.records["req-a-2"]
    assert (rec.status, rec.cost_micro_usd, rec.cache_avoided_micro_usd > 0) == ("cache_hit", 0, True)
    assert (await _ask(cache, accountant, "a", "What is the capital of Spain?", 3)).result == "miss"  # cosine 0.8


async def test_never_across_tenants_models_or_contexts(setup: Any) -> None:
    cache, scorer, _, accountant = setup
    for system in ("Be brief.", "Answer in French."):
        scorer.vectors[conversation_text(_request("Capital of France?", system)[1]["messages"])] = _unit(1, 0)
    assert (await _ask(cache, accountant, "a", "Capital of France?", 1)).result == "miss"
    assert (await _ask(cache, accountant, "a", "Capital of France?", 2)).result == "hit"
    assert (await _ask(cache, accountant, "b", "Capital of France?", 3)).result == "miss"
    assert (await _ask(cache, accountant, "a", "Capital of France?", 4, model="other")).result == "miss"
    assert (await _ask(cache, accountant, "a", "Capital of France?", 5, system="Answer in French.")).result == "miss"


async def test_rows_are_bounded_and_a_missing_vector_bypasses(setup: Any, prefix: str) -> None:
    cache, scorer, _, accountant = setup
    for i in range(5):
        text = f"question {i}"
        scorer.vectors[conversation_text(_request(text)[1]["messages"])] = _unit(*([0.0] * i), 1.0)
        assert (await _ask(cache, accountant, "a", text, i)).result == "miss"
    client = aioredis.Redis.from_url(SHARED_URL)
    try:
        (vectors,) = await client.keys(prefix + "cache:{a}:v:*")
        assert await client.hlen(vectors) == 3  # max_entries: 3, the oldest went first
        assert len(await client.keys(prefix + "cache:{a}:s:*")) == 3
    finally:
        await client.aclose()
    assert (await _ask(cache, accountant, "a", "question 4", 9)).result == "hit"
    assert (await _ask(cache, accountant, "a", "question 0", 10)).result == "miss"
    assert (await _ask(cache, accountant, "a", "never embedded", 11)).result == "bypass"


def test_a_bad_cache_block_is_refused_with_its_line() -> None:
    text = policy_yaml("http://h:1", "http://h:2") + """tenants:
  a:
    api_key_sha256: ['ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb']
    cache: {mode: semantic, ttl_s: 60}
"""
    with pytest.raises(PolicyError) as refused:
        parse_policy(text, "p.yaml")
    assert any(p.startswith("p.yaml:") and "min_similarity" in p for p in refused.value.problems)
    with pytest.raises(PolicyError, match="colour"):
        parse_policy(text.replace("ttl_s: 60}", "ttl_s: 60, min_similarity: 0.9, colour: red}"), "p.yaml")
    with pytest.raises(PolicyError, match="semantic only"):
        parse_policy(text.replace("mode: semantic, ttl_s: 60}", "mode: exact, min_similarity: 0.9}"), "p.yaml")
