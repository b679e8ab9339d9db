"""Every request the published request schema allows is served: `null` for any optional field, several
choices (each counted in the ledger), conversations of assistant and tool turns only. Against fake engines
that accept anything, so any refusal here is the gateway's own."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.ledger.store import CostRecord, MemoryLedger
from gateway.serving.openai.completions_schema import CompletionsRequest
from gateway.serving.openai.responses_schema import ResponsesRequest
from gateway.settings import Settings
from loadtest.fake_upstream import FakeUpstream
from tests.conftest import policy_yaml
from tests.harness import FakeEngines, InProcessGateway
from tests.openai_requests import requests

FAKE_TOKENS = 16  # the fake engine's answer length when the request sets no limit
Gateway = tuple[httpx.Client, MemoryLedger]
AFFORDABLE = {
    "model": st.sampled_from(["auto", "micro", "flagship"]),
    "max_tokens": st.integers(1, 8),
    "max_completion_tokens": st.integers(1, 8),
    "n": st.integers(1, 3),
    "metadata": st.dictionaries(st.from_regex(r"[a-z]{1,8}", fullmatch=True), st.text(max_size=8), max_size=2),
}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A client of the gateway, in-process (`tests.harness`; one for the module), and the gateway's ledger."""
    tmp = tmp_path_factory.mktemp("openai-requests")
    engines = FakeEngines()
    micro, flagship = engines.add("micro", FakeUpstream("micro-model")), engines.add("flagship",
                                                                                    FakeUpstream("flagship-model"))
    path = tmp / "policy.yaml"
    path.write_text(policy_yaml(micro, flagship))
    settings = Settings(policy_path=path, scorer="length", start_engines=False, ledger="memory", home=tmp)
    with InProcessGateway(settings, engines) as served:
        yield served.client, served.ledger


def _record(ledger: MemoryLedger, request_id: str) -> CostRecord:
    deadline = time.monotonic() + 5
    while request_id not in ledger.records:
        assert time.monotonic() < deadline, f"no ledger record for {request_id}"
        time.sleep(0.02)
    return ledger.records[request_id]


def _choices_streamed(text: str) -> set[int]:
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]", text[-300:]
    return {c["index"] for e in events[:-1] for c in json.loads(e)["choices"]}


def _served(gateway: Gateway, body: dict[str, Any]) -> httpx.Response:
    client, ledger = gateway
    r = client.post("/v1/chat/completions", content=json.dumps(body))
    assert r.status_code == 200, (body, r.text)
    n = body.get("n") or 1
    tokens = min(FAKE_TOKENS, body.get("max_completion_tokens") or body.get("max_tokens") or FAKE_TOKENS)
    if body.get("stream"):
        assert _choices_streamed(r.text) == set(range(n))
    else:
        assert len(r.json()["choices"]) == n and r.json()["usage"]["completion_tokens"] == n * tokens
    rec = _record(ledger, r.headers["x-request-id"])
    assert rec.completion_tokens == n * tokens and rec.usage_source == "engine"  # every choice priced
    return r


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=requests(AFFORDABLE))
def test_every_request_the_schema_allows_is_served(gateway: Gateway, body: dict[str, Any]) -> None:
    _served(gateway, body)


@pytest.mark.parametrize("field", ["n", "top_logprobs", "stream", "stream_options", "max_tokens", "logprobs",
                                   "temperature", "top_p", "user", "metadata", "max_completion_tokens"])
def test_null_is_not_set(gateway: Gateway, field: str) -> None:
    _served(gateway, {"model": "auto", "messages": [{"role": "user", "content": "hi", "name": None}], field: None})


def test_null_inside_stream_options_is_not_set(gateway: Gateway) -> None:
    body = {"model": "auto", "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "stream_options": {"include_usage": None}}
    assert "usage" not in _served(gateway, body).text  # not asked for: the gateway's own usage chunk is not shown


@pytest.mark.parametrize("stream", [False, True])
def test_several_choices_are_each_counted(gateway: Gateway, stream: bool) -> None:
    _served(gateway, {"model": "flagship", "messages": [{"role": "user", "content": "hi"}], "n": 3,
                      "max_tokens": 5, "stream": stream})


def test_a_conversation_of_assistant_and_tool_turns_is_routed_on_its_text(gateway: Gateway) -> None:
    messages = [{"role": "assistant", "content": None,
                 "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "the tool's answer " * 20}]
    r = _served(gateway, {"model": "auto", "messages": messages})
    assert r.headers["x-cascade-score"] != "none"  # scored on the tool turn's text


def test_what_the_schema_forbids_is_still_refused(gateway: Gateway) -> None:
    client, _ = gateway
    for bad, param in (({"n": 0}, "n"), ({"n": 129}, "n"), ({"stream": "yes"}, "stream"), ({"model": None}, "model")):
        body = {"model": "auto", "messages": [{"role": "user", "content": "hi"}], **bad}
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


RESPONSES_AFFORDABLE = {
    "model": st.sampled_from(["auto", "micro", "flagship"]),
    "max_output_tokens": st.integers(1, 8),
    "metadata": AFFORDABLE["metadata"],
}
COMPLETIONS_AFFORDABLE = {**AFFORDABLE, "n": st.integers(1, 2)}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=requests(RESPONSES_AFFORDABLE, ResponsesRequest))
def test_every_responses_request_the_schema_allows_is_served(gateway: Gateway,
                                                             body: dict[str, Any]) -> None:
    client, ledger = gateway
    r = client.post("/v1/responses", content=json.dumps(body))
    assert r.status_code == 200, (body, r.text)
    tokens = min(FAKE_TOKENS, body.get("max_output_tokens") or FAKE_TOKENS)
    if body.get("stream"):
        assert r.text.rstrip().splitlines()[-2] == "event: response.completed", r.text[-300:]
    else:
        assert r.json()["usage"]["output_tokens"] == tokens
    rec = _record(ledger, r.headers["x-request-id"])
    assert (rec.endpoint, rec.completion_tokens, rec.usage_source) == ("responses", tokens, "engine")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=requests(COMPLETIONS_AFFORDABLE, CompletionsRequest))
def test_every_completions_request_the_schema_allows_is_served(gateway: Gateway,
                                                               body: dict[str, Any]) -> None:
    client, ledger = gateway
    r = client.post("/v1/completions", content=json.dumps(body))
    assert r.status_code == 200, (body, r.text)
    prompt = body["prompt"]
    prompts = len(prompt) if isinstance(prompt, list) and not isinstance(prompt[0], int) else 1
    tokens = min(FAKE_TOKENS, body.get("max_tokens") or FAKE_TOKENS) * prompts * (body.get("n") or 1)
    if not body.get("stream"):
        assert r.json()["usage"]["completion_tokens"] == tokens
    elif not (body.get("stream_options") or {}).get("include_usage"):
        assert '"usage"' not in r.text  # not asked for: the gateway's own usage chunk is not shown
    rec = _record(ledger, r.headers["x-request-id"])
    assert (rec.endpoint, rec.completion_tokens, rec.usage_source) == ("completions", tokens, "engine")
