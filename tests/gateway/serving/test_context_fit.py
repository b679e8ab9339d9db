"""Conversation length as a routing input (`gateway.serving.routing.context_fit`): a request goes where its prompt and
completion limit fit, or gets a 400 naming the sizes. Prompts are counted by a fake engine `/tokenize` (its count is
set by the test); the fast path must not call it."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from backends.clients.pool import Pool
from gateway.errors import BadRequest
from gateway.serving.openai.endpoints import COMPLETIONS, RESPONSES, NativeBody
from gateway.serving.openai.schema import ChatRequest
from gateway.serving.routing.context_fit import ContextFit
from policies.decide import RouteDecision, RouteStep
from policies.ladder import ActiveStep, LadderState
from policies.ladder_schema import TruncateContext
from policies.schema import Policy

PRICE = {"input_per_mtok": "1", "output_per_mtok": "1"}


def _policy(tenants: dict[str, Any] | None = None) -> Any:
    policy = Policy.model_validate({
        "pools": {
            "micro": {"type": "local", "price": PRICE, "engine": {"model": "demo:micro", "served_name": "micro",
                                                                 "max_model_len": 1024, "base_port": 8101}},
            "flagship": {"type": "local", "price": PRICE, "engine": {"model": "demo:flagship",
                                                                    "served_name": "flagship",
                                                                    "max_model_len": 4096, "base_port": 8201}}},
        "routing": {"micro_pool": "micro", "flagship_pool": "flagship", "threshold": 0.5},
        "tenants": tenants or {}})
    return SimpleNamespace(policy=policy)


class _Tokenizer:
    """An engine client whose `/tokenize` answers `count` and records each body, per base URL."""

    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = counts
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def post_json(self, base_url: str, path: str, body: bytes, headers: Any = None) -> bytes:
        assert path == "/tokenize"
        self.calls.append((base_url, orjson.loads(body)))
        return orjson.dumps({"count": self.counts[base_url]})


def _fit(counts: dict[str, int]) -> tuple[ContextFit, _Tokenizer]:
    client = _Tokenizer(counts)
    pools = {name: Pool(name, [f"http://{name}"], client) for name in ("micro", "flagship")}  # type: ignore[arg-type]
    for pool in pools.values():
        pool.replicas[0].healthy = True
    return ContextFit(client, pools.get), client  # type: ignore[arg-type]


def _request(text: str, **fields: Any) -> tuple[ChatRequest, dict[str, Any]]:
    raw = {"model": "auto", "messages": [{"role": "user", "content": text}], **fields}
    return ChatRequest.model_validate(raw), raw


def _place(fit: ContextFit, text: str, pool: str = "micro", rule: str = "threshold", tenant: str = "default",
           native: NativeBody | None = None, ladder: LadderState | None = None, downgrade: bool = False,
           policy: Any = None, **fields: Any) -> RouteDecision:
    request, raw = _request(text, **fields)
    decision = RouteDecision(pool, pool, 0.1, rule, "scored", "1")
    return asyncio.run(fit.place(policy or _policy(), decision, request, raw, native, tenant,
                                 ladder or LadderState(), downgrade))


def test_a_short_request_is_not_counted() -> None:
    fit, client = _fit({})
    assert _place(fit, "hello there", max_tokens=100).pool == "micro"
    assert client.calls == []  # its bytes bound it: no /tokenize on the hot path


def test_a_long_prompt_that_fits_is_counted_once_and_stays() -> None:
    fit, client = _fit({"http://micro": 700})
    decision = _place(fit, "word " * 900, max_tokens=100)  # 4,500 bytes: the bound says maybe not
    assert (decision.pool, decision.rule) == ("micro", "threshold")
    assert [url for url, _ in client.calls] == ["http://micro"]


def test_a_conversation_too_long_for_micro_goes_to_the_flagship_whose_context_holds_it() -> None:
    fit, client = _fit({"http://micro": 1500, "http://flagship": 1500})
    decision = _place(fit, "word " * 1500, max_tokens=200)
    assert (decision.pool, decision.model, decision.rule) == ("flagship", "flagship", "context-fit")
    assert decision.route == (RouteStep("context-fit", "flagship", "a prompt of 1500 tokens and max_tokens=200 does "
                                        "not fit 'micro' (1024 tokens)"),)
    assert "a prompt of 1500 tokens and max_tokens=200 does not fit 'micro' (context 1024 tokens)" in decision.reason
    assert {url for url, _ in client.calls} == {"http://micro", "http://flagship"}  # counted by each pool's tokenizer


def test_without_a_completion_limit_one_token_must_fit() -> None:
    fit, _ = _fit({"http://micro": 1023})
    assert _place(fit, "word " * 1500).pool == "micro"
    fit, _ = _fit({"http://micro": 1024, "http://flagship": 1024})
    assert _place(fit, "word " * 1500).pool == "flagship"


def test_a_pinned_model_is_never_moved_the_400_names_the_sizes() -> None:
    fit, _ = _fit({"http://micro": 1500})
    with pytest.raises(BadRequest) as caught:
        _place(fit, "word " * 1500, rule="pinned", max_tokens=10)
    err = caught.value
    assert (err.status, err.code, err.param) == (400, "context_length_exceeded", "messages")
    assert "a prompt of 1500 tokens and max_tokens=10" in err.message and "'micro' holds 1024 tokens" in err.message
    assert "pinned" in err.message


def test_a_conversation_larger_than_every_context_is_a_400_naming_both() -> None:
    fit, _ = _fit({"http://micro": 5000, "http://flagship": 5000})
    with pytest.raises(BadRequest) as caught:
        _place(fit, "word " * 5000)
    assert "'micro' holds 1024 tokens, 'flagship' holds 4096 tokens" in caught.value.message
    assert caught.value.code == "context_length_exceeded"


def test_the_tenant_decision_holds_a_long_conversation_where_it_may_go() -> None:
    fit, _ = _fit({"http://micro": 1500, "http://flagship": 1500})
    limited = _policy({"small": {"api_key_sha256": ["0" * 64], "allowed_pools": ["micro"]}})
    with pytest.raises(BadRequest, match="'micro' holds 1024 tokens, prompt"):
        _place(fit, "word " * 1500, tenant="small", policy=limited)
    with pytest.raises(BadRequest, match="'micro' holds 1024 tokens, prompt"):
        _place(fit, "word " * 1500, downgrade=True)  # over budget, downgraded: not moved up to flagship prices


def test_ladder_truncation_makes_a_long_chat_fit() -> None:
    fit, _ = _fit({"http://micro": 3000})
    step = ActiveStep("truncate", TruncateContext(type="truncate_context", max_tokens=800), 0.0, pool="micro")
    ladder = LadderState.combine([step])
    assert _place(fit, "word " * 3000, ladder=ladder, max_tokens=100).pool == "micro"


@pytest.mark.parametrize(("limit", "native", "field"), [
    ({"max_tokens": 2000}, None, "max_tokens"),
    ({"max_completion_tokens": 2000}, None, "max_completion_tokens"),
    ({"max_tokens": 2000}, NativeBody(RESPONSES, {"input": "hi"}), "max_output_tokens"),
    ({"max_tokens": 2000}, NativeBody(COMPLETIONS, {"prompt": "hi"}), "max_tokens"),
])
def test_a_completion_limit_no_pinned_pool_holds_names_the_clients_field(
        limit: dict[str, Any], native: NativeBody | None, field: str) -> None:
    fit, client = _fit({})
    with pytest.raises(BadRequest) as caught:
        _place(fit, "hi", rule="pinned", native=native, **limit)
    assert caught.value.param == field and field in caught.value.message
    assert client.calls == []  # nothing to count: no prompt fits beside it


@pytest.mark.parametrize(("native", "param"), [(NativeBody(RESPONSES, {"input": "word " * 1500}), "input"),
                                               (NativeBody(COMPLETIONS, {"prompt": "word " * 1500}), "prompt")])
def test_the_other_endpoints_name_their_prompt_field(native: NativeBody, param: str) -> None:
    fit, client = _fit({"http://micro": 1500})
    with pytest.raises(BadRequest) as caught:
        _place(fit, "word " * 1500, rule="pinned", native=native)
    assert caught.value.param == param
    body = client.calls[0][1]
    assert ("prompt" in body) is (native.endpoint is COMPLETIONS)  # a completions prompt is counted as it is


def test_tools_are_counted_with_the_prompt() -> None:
    fit, client = _fit({"http://micro": 100})
    tools = [{"type": "function", "function": {"name": "f" * 3000, "parameters": {"type": "object"}}}]
    _place(fit, "hi", tools=tools)
    assert client.calls[0][1]["tools"] == tools
