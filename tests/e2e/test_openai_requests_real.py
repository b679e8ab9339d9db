"""The OpenAI surface against a real vLLM engine, directly and through the gateway, one demo micro engine (with the
shipped tool-call parser) behind both pools; a few minutes.

Requests generated from the published request schemas of chat, Responses and completions (every optional field
absent, `null` or set): the gateway serves what the engine serves, and what the engine refuses comes back with the
engine's status and message. Then the official openai SDK: `responses.create` (text and streamed),
`completions.create`, a forced tool call (chat, streamed, Responses) and an auto tool choice, each answered the same
way by the engine directly, with routing headers and the exact ledger record (real Redis)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.serving.openai.completions_schema import CompletionsRequest
from gateway.serving.openai.responses_schema import ResponsesRequest
from policies.loader import load_policy
from policies.pools import LocalPool
from tests.conftest import delete_prefix, ledger_record
from tests.engines import SharedEngines, gateway_on_shared_engines
from tests.openai_requests import requests
from tests.servers import ROOT

pytestmark = [pytest.mark.engines, pytest.mark.redis]
HTTP = httpx.Client()  # one client for the property tests' many requests (a new one builds an SSL context each)

TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=24)
AFFORDABLE = {
    "model": st.just("auto"),
    "max_tokens": st.integers(1, 4),
    "max_completion_tokens": st.integers(1, 4),
    "n": st.integers(1, 2),
    "content": TEXT | st.none(),
    "metadata": st.dictionaries(st.from_regex(r"[a-z]{1,8}", fullmatch=True), TEXT, max_size=2),
}


@pytest.fixture(scope="module")
def prefix() -> Iterator[str]:
    value = f"test:e2e-openai:{uuid.uuid4().hex[:8]}:"
    yield value
    delete_prefix(value)


@pytest.fixture(scope="module")
def served(shared_engines: SharedEngines, tmp_path_factory: pytest.TempPathFactory,
           prefix: str) -> Iterator[tuple[str, str]]:
    """(gateway URL, engine URL): the shipped demo micro engine (shared), with the shipped policies' tool-call
    parser; the flagship pool is the same engine as a remote pool that the gateway treats as chat-only
    (`responses: chat`: Responses requests routed there are translated)."""
    shipped = load_policy(ROOT / "policies" / "default.yaml").policy.pools["micro"]
    assert isinstance(shipped, LocalPool) and shipped.engine.tool_calling is not None
    ((engine,),) = shared_engines.urls([shipped.engine])
    tmp = tmp_path_factory.mktemp("openai-real")
    policy = tmp / "policy.yaml"
    policy.write_text(f"""version: 1
pools:
  micro:
    type: local
    price: {{input_per_mtok: "0.20", output_per_mtok: "0.20"}}
    engine: {shipped.engine.model_dump_json(exclude_defaults=True)}
  flagship:
    type: remote
    urls: ["{engine}"]
    model: micro
    responses: chat
    price: {{input_per_mtok: "3.00", output_per_mtok: "15.00"}}
routing: {{micro_pool: micro, flagship_pool: flagship, threshold: 0.5}}
""")
    with gateway_on_shared_engines(shared_engines, policy, prefix, ["--scorer", "length", "--home", str(tmp)]) as gw:
        assert gw.engines["micro"] == engine
        yield gw.url, engine


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=requests(AFFORDABLE))
def test_the_gateway_serves_what_the_engine_serves(served: tuple[str, str], body: dict[str, Any]) -> None:
    gateway, engine = served
    as_json = {"content-type": "application/json"}
    # The gateway treats a top-level `null` as "not set" (the API allows it) and does not send it on, so the
    # engine is asked what the gateway asks it: the same body without those nulls.
    sent = {k: v for k, v in body.items() if v is not None}
    direct = HTTP.post(engine + "/v1/chat/completions", content=json.dumps(dict(sent, model="micro")),
                        headers=as_json, timeout=60)
    routed = HTTP.post(gateway + "/v1/chat/completions", content=json.dumps(body), headers=as_json, timeout=60)
    assert routed.status_code == direct.status_code, (body, direct.text, routed.text)
    if direct.status_code >= 400:
        engine_message = direct.json()["error"]["message"] if "error" in direct.json() else direct.json()["message"]
        assert engine_message in routed.json()["error"]["message"], (body, direct.text, routed.text)
    elif not body.get("stream"):
        assert len(routed.json()["choices"]) == (body.get("n") or 1)


def _same_outcome(gateway: str, engine: str, path: str, body: dict[str, Any]) -> httpx.Response:
    """Send `body` to the engine (as the gateway forwards it) and through the gateway; the same status, and the
    engine's own message when it refuses."""
    as_json = {"content-type": "application/json"}
    sent = {k: v for k, v in body.items() if v is not None}
    direct = HTTP.post(engine + path, content=json.dumps(dict(sent, model="micro")), headers=as_json, timeout=60)
    routed = HTTP.post(gateway + path, content=json.dumps(body), headers=as_json, timeout=60)
    assert routed.status_code == direct.status_code, (body, direct.text, routed.text)
    if direct.status_code >= 400:
        engine_message = direct.json()["error"]["message"] if "error" in direct.json() else direct.json()["message"]
        assert engine_message in routed.json()["error"]["message"], (body, direct.text, routed.text)
    return routed


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=requests({"model": st.just("micro"), "max_output_tokens": st.integers(1, 4), "content": TEXT,
                      "metadata": AFFORDABLE["metadata"]}, ResponsesRequest))
def test_the_gateway_serves_the_responses_requests_the_engine_serves(served: tuple[str, str],
                                                                     body: dict[str, Any]) -> None:
    # pinned to the native pool: the chat-only flagship refuses `store: true`, which the engine takes
    routed = _same_outcome(*served, "/v1/responses", body)
    if routed.status_code == 200 and not body.get("stream"):
        assert routed.json()["object"] == "response"


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=requests({"model": st.just("auto"), "max_tokens": st.integers(1, 4), "n": st.integers(1, 2),
                      "prompt": TEXT | st.lists(st.integers(1, 200), min_size=1, max_size=4)}, CompletionsRequest))
def test_the_gateway_serves_the_completions_requests_the_engine_serves(served: tuple[str, str],
                                                                       body: dict[str, Any]) -> None:
    routed = _same_outcome(*served, "/v1/completions", body)
    if routed.status_code == 200 and not body.get("stream"):
        assert len(routed.json()["choices"]) == (body.get("n") or 1)



def _priced(rec: dict[str, str], endpoint: str, pool: str, prompt: int, completion: int) -> None:
    """The record names the endpoint and pool, holds the engine's usage exactly and its price (default prices)."""
    per_mtok = {"micro": (200_000, 200_000), "flagship": (3_000_000, 15_000_000)}[pool]
    assert (rec["endpoint"], rec["pool"], rec["usage_source"], rec["status"]) == (endpoint, pool, "engine", "ok")
    assert (int(rec["prompt_tokens"]), int(rec["completion_tokens"])) == (prompt, completion)
    expected = (prompt * per_mtok[0] + completion * per_mtok[1] + 500_000) // 1_000_000
    assert int(rec["cost_micro_usd"]) == expected


def test_responses_and_completions_with_the_sdk(served: tuple[str, str], prefix: str) -> None:
    gateway, engine = served
    via = openai.OpenAI(base_url=gateway + "/v1", api_key="unused")
    direct = openai.OpenAI(base_url=engine + "/v1", api_key="unused")
    raw = via.responses.with_raw_response.create(model="auto", instructions="answer briefly", input="hi there",
                                                 max_output_tokens=8)
    resp = raw.parse()
    # the same prompt, the same count; the answers are sampled, so only their limit is shared (one may stop early)
    alone = direct.responses.create(model="micro", instructions="answer briefly", input="hi there", max_output_tokens=8)
    assert alone.usage is not None and resp.usage is not None
    assert alone.usage.input_tokens == resp.usage.input_tokens and resp.usage.output_tokens <= 8
    assert raw.headers["x-cascade-endpoint"] == "responses" and raw.headers["x-cascade-pool"] == "micro"
    assert resp.usage is not None and resp.output_text
    _priced(ledger_record(prefix, raw.headers["x-request-id"]), "responses", "micro", resp.usage.input_tokens,
            resp.usage.output_tokens)

    long_input: Any = [{"role": "user", "content": "explain the proof step by step " * 30}]
    with via.responses.with_streaming_response.create(model="auto", input=long_input, stream=True,
                                                      max_output_tokens=6) as streamed:
        assert streamed.headers["x-cascade-pool"] == "flagship"
        events: list[Any] = list(streamed.parse())
    assert events[-1].type in ("response.completed", "response.incomplete")
    assert events[0].response.id.startswith("resp_chatcmpl")  # translated: the flagship pool is chat-only
    usage = events[-1].response.usage
    assert usage is not None and sum(e.type == "response.output_text.delta" for e in events) >= 1
    rec = ledger_record(prefix, streamed.headers["x-request-id"])
    _priced(rec, "responses", "flagship", usage.input_tokens, usage.output_tokens)
    assert rec["ttft_ms"]

    done = via.completions.with_raw_response.create(model="auto", prompt="Once upon a time", max_tokens=5)
    completion = done.parse()
    assert completion.usage is not None and completion.choices[0].text
    alone_usage = direct.completions.create(model="micro", prompt="Once upon a time", max_tokens=5).usage
    assert alone_usage is not None and alone_usage.prompt_tokens == completion.usage.prompt_tokens
    assert completion.usage.completion_tokens <= 5
    _priced(ledger_record(prefix, done.headers["x-request-id"]), "completions", "micro", completion.usage.prompt_tokens,
            completion.usage.completion_tokens)


WEATHER: Any = {"type": "function", "function": {
    "name": "get_weather", "description": "the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
NAMED: Any = {"type": "function", "function": {"name": "get_weather"}}
ASK: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
# The demo model's text is random: an auto tool choice is held to the pythonic parser's call syntax by a
# structured-output pattern, so that the parser (the engine's --tool-call-parser) has a call to parse.
PYTHONIC_CALL = {"structured_outputs": {"regex": r"\[get_weather\(city='Paris'\)\]"}}


def test_tool_calls_forced_and_auto_directly_and_through_the_gateway(served: tuple[str, str], prefix: str) -> None:
    gateway, engine = served
    via = openai.OpenAI(base_url=gateway + "/v1", api_key="unused")
    direct = openai.OpenAI(base_url=engine + "/v1", api_key="unused")
    for client, model in ((direct, "micro"), (via, "auto")):
        forced = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER], tool_choice=NAMED,
                                                max_tokens=24)
        calls = forced.choices[0].message.tool_calls
        assert calls and calls[0].type == "function" and calls[0].function.name == "get_weather", forced
        auto = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER], tool_choice="auto",
                                              max_tokens=32, extra_body=PYTHONIC_CALL)
        choice = auto.choices[0]
        calls = choice.message.tool_calls
        assert choice.finish_reason == "tool_calls" and calls and calls[0].type == "function", auto
        assert json.loads(calls[0].function.arguments) == {"city": "Paris"}

    raw = via.chat.completions.with_raw_response.create(model="auto", messages=ASK, tools=[WEATHER],
                                                        tool_choice=NAMED, max_tokens=24)
    answer = raw.parse()
    assert answer.usage is not None and raw.headers["x-cascade-endpoint"] == "chat"
    assert raw.headers["x-cascade-pool"] == "micro"
    _priced(ledger_record(prefix, raw.headers["x-request-id"]), "chat", "micro", answer.usage.prompt_tokens,
            answer.usage.completion_tokens)  # tool-call tokens priced like any other

    with via.chat.completions.with_streaming_response.create(
            model="auto", messages=ASK, tools=[WEATHER], tool_choice=NAMED, max_tokens=16, stream=True,
            stream_options={"include_usage": True}) as streamed:
        chunks = list(streamed.parse())
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or ()]
    assert deltas and deltas[0].function is not None and deltas[0].function.name == "get_weather"
    usage = chunks[-1].usage
    assert usage is not None
    _priced(ledger_record(prefix, streamed.headers["x-request-id"]), "chat", "micro", usage.prompt_tokens,
            usage.completion_tokens)

    tool: Any = {"type": "function", "name": "get_weather", "parameters": WEATHER["function"]["parameters"]}
    choice_of: Any = {"type": "function", "name": "get_weather"}
    for client, model in ((direct, "micro"), (via, "auto")):
        response = client.responses.create(model=model, input="What is the weather in Paris?", tools=[tool],
                                           tool_choice=choice_of, max_output_tokens=24)
        item = response.output[0]
        assert item.type == "function_call" and item.name == "get_weather", response
    translated = via.responses.with_raw_response.create(model="flagship", input="What is the weather in Paris?",
                                                        tools=[tool], tool_choice=choice_of, max_output_tokens=24)
    response = translated.parse()
    item = response.output[0]
    assert response.id.startswith("resp_chatcmpl") and item.type == "function_call" and item.name == "get_weather"
    assert response.usage is not None
    _priced(ledger_record(prefix, translated.headers["x-request-id"]), "responses", "flagship",
            response.usage.input_tokens, response.usage.output_tokens)


def test_what_the_engine_refuses_on_an_endpoint_comes_back_as_its_400(served: tuple[str, str]) -> None:
    for path, body in (("/v1/completions", {"model": "micro", "prompt": "x", "max_tokens": 2, "logprobs": 50}),
                       ("/v1/responses", {"model": "micro", "input": "x", "max_output_tokens": 2,
                                          "truncation": "sometimes"})):
        routed = _same_outcome(*served, path, body)
        assert routed.status_code == 400 and routed.json()["error"]["code"] == "upstream_rejected", routed.text
