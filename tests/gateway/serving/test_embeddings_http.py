"""`/v1/embeddings` through the gateway in-process, over fake engines that answer it (`loadtest.fake_embeddings`):
the official SDK's call, every input form, the pool a `model` names (and `auto`), the errors as the OpenAI API
words them, generative requests kept off embedding pools, and the ledger record priced per input token."""

from __future__ import annotations

import base64
import struct
from pathlib import Path

import httpx
import pytest

from gateway.api.auth import hash_key
from loadtest.fake_embeddings import vector_of
from loadtest.fake_upstream import FakeUpstream
from tests.conftest import GatewayFactory, Upstreams, policy_yaml
from tests.harness import FakeEngines, Gateway

PRICE = 20_000  # micro-USD per million input tokens ("0.02")
EMBED_POOLS = """  embed:
    type: remote
    kind: embedding
    urls: ["{embed}"]
    model: embed-model
    price: {{input_per_mtok: "0.02"}}
"""
SECOND_POOL = """  embed-large:
    type: remote
    kind: embedding
    urls: ["{embed}"]
    model: embed-large-model
    price: {{input_per_mtok: "0.13"}}
"""


def embedding_policy(upstreams: Upstreams, embed_url: str, extra_pools: str = "", extra: str = "") -> str:
    """`policy_yaml` over `upstreams` with the embedding pool `embed` (and `extra_pools`) on `embed_url`."""
    text = policy_yaml(upstreams[1], upstreams[3], extra)
    pools = (EMBED_POOLS + extra_pools).format(embed=embed_url)
    return text.replace("routing:\n", pools + "routing:\n", 1)


@pytest.fixture
def embedder(fake_engines: FakeEngines) -> tuple[FakeUpstream, str]:
    engine = FakeUpstream("embed-model")
    return engine, fake_engines.add("embed", engine)


def _gateway(tmp_path: Path, make_gateway: GatewayFactory, text: str) -> Gateway:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return make_gateway(path)


@pytest.fixture
def gateway(tmp_path: Path, make_gateway: GatewayFactory, fake_upstreams: Upstreams,
            embedder: tuple[FakeUpstream, str]) -> Gateway:
    return _gateway(tmp_path, make_gateway, embedding_policy(fake_upstreams, embedder[1]))


def _embed(gateway: Gateway, **body: object) -> httpx.Response:
    return gateway.client.post("/v1/embeddings", json=body)


def test_the_sdk_embeddings_call_is_served_by_the_embedding_pool_and_billed_per_input_token(
        gateway: Gateway, embedder: tuple[FakeUpstream, str]) -> None:
    client = gateway.openai()
    raw = client.embeddings.with_raw_response.create(model="embed", input=["the first text", "a second"])
    answer = raw.parse()
    # decoded by the SDK from base64 float32 (the fake's numbers are exact there)
    assert [d.embedding for d in answer.data] == [vector_of("the first text"), vector_of("a second")]
    assert embedder[0].last_body == {"model": "embed-model", "input": ["the first text", "a second"],
                                     "encoding_format": "base64"}  # the SDK asks for base64 unless told
    assert answer.usage.prompt_tokens == 5
    assert raw.headers["x-cascade-endpoint"] == "embeddings"
    assert raw.headers["x-cascade-pool"] == "embed"
    assert raw.headers["x-cascade-route"] == "pinned:embed"
    assert raw.headers["x-request-id"].startswith("req_embd_")
    rec = gateway.record(raw.headers["x-request-id"])
    assert (rec.endpoint, rec.pool, rec.model, rec.status, rec.usage_source) == (
        "embeddings", "embed", "embed-model", "ok", "engine")
    assert (rec.prompt_tokens, rec.completion_tokens) == (5, 0)
    assert rec.cost_micro_usd == (5 * PRICE + 500_000) // 1_000_000 == 0  # a fraction of a micro-USD rounds to 0
    assert rec.flagship_cost_micro_usd == rec.cost_micro_usd  # no savings claimed for an embedding
    big = client.embeddings.create(model="embed", input=["word " * 300] * 200)  # 60,000 tokens at 0.02 USD/M
    assert len(big.data) == 200 and big.usage.prompt_tokens == 60_000
    assert max(r.cost_micro_usd for r in gateway.records(2).values()) == 1200


@pytest.mark.parametrize(("given", "expected"), [
    ("one text", [vector_of("one text")]),
    (["a", "b c"], [vector_of("a"), vector_of("b c")]),
    ([1, 2, 3], [vector_of([1, 2, 3])]),
    ([[1, 2], [3]], [vector_of([1, 2]), vector_of([3])]),
])
def test_every_input_form_is_passed_on(gateway: Gateway, given: object, expected: list[list[float]]) -> None:
    response = _embed(gateway, model="embed", input=given, encoding_format="float")
    assert response.status_code == 200, response.text
    assert [d["embedding"] for d in response.json()["data"]] == expected


def test_base64_and_dimensions_are_passed_on(gateway: Gateway, embedder: tuple[FakeUpstream, str]) -> None:
    response = _embed(gateway, model="embed", input="text", encoding_format="base64", dimensions=4)
    assert response.status_code == 200, response.text
    packed = base64.b64decode(response.json()["data"][0]["embedding"])
    assert list(struct.unpack("<4f", packed)) == vector_of("text", 4)
    assert embedder[0].last_body == {"model": "embed-model", "input": "text", "encoding_format": "base64",
                                     "dimensions": 4}
    refused = _embed(gateway, model="embed", input="text", dimensions=64)  # more than the model has: its own 400
    assert refused.status_code == 400 and "dimensions" in refused.json()["error"]["message"]


@pytest.mark.parametrize(("body", "status", "param", "code"), [
    ({"model": "nope", "input": "x"}, 404, "model", "model_not_found"),
    ({"model": "micro", "input": "x"}, 404, "model", "model_not_supported"),
    ({"model": "embed"}, 400, "input", "missing_required_parameter"),
    ({"model": "embed", "input": ""}, 400, "input", "invalid_value"),
    ({"model": "embed", "input": []}, 400, "input", "invalid_value"),
    ({"model": "embed", "input": [[]]}, 400, "input", "invalid_value"),
    ({"model": "embed", "input": ["a", 1]}, 400, "input", "invalid_value"),
    ({"model": "embed", "input": [-1]}, 400, "input", "invalid_value"),
    ({"model": "embed", "input": {"text": "a"}}, 400, "input", "invalid_value"),
    ({"model": "embed", "input": ["a"] * 2049}, 400, "input", "invalid_value"),
    ({"model": "embed", "input": "a", "encoding_format": "int8"}, 400, "encoding_format", "invalid_value"),
    ({"model": "embed", "input": "a", "dimensions": 0}, 400, "dimensions", "invalid_value"),
    ({"model": "embed", "input": "a", "dimensions": "4"}, 400, "dimensions", "invalid_value"),
    ({"input": "a"}, 400, "model", "invalid_value"),
])
def test_bad_requests_get_the_openai_error(gateway: Gateway, embedder: tuple[FakeUpstream, str],
                                           body: dict[str, object], status: int, param: str, code: str) -> None:
    response = _embed(gateway, **body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"], error["type"]) == (param, code, "invalid_request_error"), error
    assert embedder[0].embedding_requests == 0
    assert not gateway.ledger.records


def test_a_body_that_is_not_json_is_refused(gateway: Gateway) -> None:
    response = gateway.client.post("/v1/embeddings", content=b"{nope", headers={"content-type": "application/json"})
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_json"


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/completions", {"prompt": "hi"}),
    ("/v1/responses", {"input": "hi"}),
])
def test_a_generative_request_naming_an_embedding_model_is_refused(
        gateway: Gateway, embedder: tuple[FakeUpstream, str], path: str, body: dict[str, object]) -> None:
    for model in ("embed", "embed-model"):  # the pool and its served name
        response = gateway.client.post(path, json={"model": model, **body})
        assert response.status_code == 404, response.text
        error = response.json()["error"]
        assert (error["param"], error["code"]) == ("model", "model_not_supported"), error
        assert "/v1/embeddings" in error["message"]
    assert embedder[0].embedding_requests == 0 and embedder[0].requests == 0


def test_auto_is_the_one_embedding_pool_and_never_a_generative_target(
        gateway: Gateway, fake_upstreams: Upstreams, embedder: tuple[FakeUpstream, str]) -> None:
    response = _embed(gateway, model="auto", input="text")
    assert response.status_code == 200, response.text
    assert response.headers["x-cascade-route"] == "embedding:embed"
    for text in ("short", "long " * 400):  # the length scorer sends these to either tier
        chat = gateway.client.post("/v1/chat/completions", json={
            "model": "auto", "messages": [{"role": "user", "content": text}]})
        assert chat.status_code == 200 and chat.headers["x-cascade-pool"] in ("micro", "flagship")
    assert embedder[0].requests == 0


def test_auto_with_several_embedding_pools_is_resolved_by_the_tenant_or_refused(
        tmp_path: Path, make_gateway: GatewayFactory, fake_upstreams: Upstreams,
        embedder: tuple[FakeUpstream, str]) -> None:
    tenants = f"""tenants:
  both: {{api_key_sha256: ['{hash_key("sk-both")}']}}
  small: {{api_key_sha256: ['{hash_key("sk-small")}'], allowed_pools: [embed, micro]}}
  chat-only: {{api_key_sha256: ['{hash_key("sk-chat")}'], allowed_pools: [micro]}}
  vectors: {{api_key_sha256: ['{hash_key("sk-vectors")}'], allowed_pools: [embed-large, embed, micro]}}
"""
    gateway = _gateway(tmp_path, make_gateway, embedding_policy(fake_upstreams, embedder[1], SECOND_POOL, tenants))

    def post(key: str, model: str = "auto", path: str = "/v1/embeddings") -> httpx.Response:
        body = {"model": model, "input": "x"} if path == "/v1/embeddings" else {
            "model": model, "messages": [{"role": "user", "content": "hi"}]}
        return gateway.client.post(path, json=body, headers={"authorization": f"Bearer {key}"})

    ambiguous = post("sk-both")
    assert ambiguous.status_code == 400 and ambiguous.json()["error"]["code"] == "model_ambiguous"
    assert "embed-large" in ambiguous.json()["error"]["message"]
    assert post("sk-both", "embed-large").headers["x-cascade-pool"] == "embed-large"
    assert post("sk-small").headers["x-cascade-pool"] == "embed"
    refused = post("sk-small", "embed-large")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "pool_not_allowed"
    none = post("sk-chat")
    assert none.status_code == 404 and none.json()["error"]["code"] == "model_not_found"
    # a tenant whose first allowed pool is an embedding pool: chat goes to its first generative pool
    chat = post("sk-vectors", "flagship", "/v1/chat/completions")
    assert chat.status_code == 403  # a pinned pool outside the allowed ones stays refused
    routed = post("sk-vectors", "auto", "/v1/chat/completions")
    assert routed.status_code == 200 and routed.headers["x-cascade-pool"] == "micro", routed.text


def test_an_engine_that_is_down_is_a_503_and_bills_nothing(
        tmp_path: Path, make_gateway: GatewayFactory, fake_upstreams: Upstreams) -> None:
    gateway = _gateway(tmp_path, make_gateway, embedding_policy(fake_upstreams, "http://gone.engine.test"))
    response = _embed(gateway, model="embed", input="x")
    assert response.status_code == 503, response.text
    assert response.json()["error"]["type"] in ("service_unavailable", "overloaded", "api_error"), response.text
    assert not gateway.ledger.records


def test_the_tenants_rate_limits_count_the_input_tokens(
        tmp_path: Path, make_gateway: GatewayFactory, fake_upstreams: Upstreams,
        embedder: tuple[FakeUpstream, str]) -> None:
    tenants = f"""tenants:
  metered: {{api_key_sha256: ['{hash_key("sk-m")}'], rate_limits: {{tokens_per_minute: 100}}}}
"""
    gateway = _gateway(tmp_path, make_gateway, embedding_policy(fake_upstreams, embedder[1], extra=tenants))
    headers = {"authorization": "Bearer sk-m"}
    text = "x" * 240  # 60 tokens estimated (4 characters a token)
    first = gateway.client.post("/v1/embeddings", json={"model": "embed", "input": text}, headers=headers)
    assert first.status_code == 200, first.text
    second = gateway.client.post("/v1/embeddings", json={"model": "embed", "input": text}, headers=headers)
    assert second.status_code == 429, second.text
    tokens = gateway.client.post("/v1/embeddings", json={"model": "embed", "input": list(range(30))}, headers=headers)
    assert tokens.status_code == 200, tokens.text  # a token array counts its length: 60 + 30 fit in 100
    assert embedder[0].embedding_requests == 2
