"""`/v1/responses` on a pool that speaks chat completions only (`responses: chat`), in-process (`tests.harness`) in
front of fake engines with the official openai SDK: translated both ways, streamed as Responses events, recorded as
a Responses request, and what cannot be translated refused with 400."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from gateway.serving.sending.responses_chat import chat_request
from tests.conftest import GatewayFactory, Upstreams, policy_yaml
from tests.harness import Gateway

TOOL: Any = {"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}


@pytest.fixture
def gateway(make_gateway: GatewayFactory, fake_upstreams: Upstreams, tmp_path: Path) -> Gateway:
    _, micro_url, _, flagship_url = fake_upstreams
    policy = tmp_path / "policy.yaml"
    text = policy_yaml(micro_url, flagship_url)
    marker = "    model: flagship-model\n"
    assert text.count(marker) == 1
    policy.write_text(text.replace(marker, marker + "    responses: chat\n"))
    return make_gateway(policy, probe_interval_s=0.2)


def test_a_translated_answer_and_its_record(gateway: Gateway) -> None:
    client = gateway.openai()
    raw = client.responses.with_raw_response.create(model="flagship", instructions="be brief", input="hi",
                                                    max_output_tokens=5)
    resp = raw.parse()
    assert resp.id == "resp_chatcmpl-fake"  # built by the gateway from the engine's chat answer
    assert resp.output_text == "w0 w1 w2 w3 w4" and resp.status == "incomplete"
    assert resp.usage is not None and resp.usage.output_tokens == 5
    rec = gateway.record(raw.headers["x-request-id"])
    assert (rec.endpoint, rec.pool, rec.prompt_tokens, rec.completion_tokens) == (
        "responses", "flagship", resp.usage.input_tokens, 5)
    micro = client.responses.create(model="micro", input="hi", max_output_tokens=2)
    assert micro.id == "resp_fake"  # a native pool gets the Responses request itself


def test_a_translated_stream_is_a_responses_stream(gateway: Gateway) -> None:
    client = gateway.openai()
    with client.responses.with_streaming_response.create(model="flagship", input="hi", max_output_tokens=4,
                                                         stream=True) as raw:
        events: list[Any] = list(raw.parse())
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.incomplete"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == " w0 w1 w2 w3"
    assert events[-1].response.output[0].content[0].text == " w0 w1 w2 w3"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    usage = events[-1].response.usage
    rec = gateway.record(raw.headers["x-request-id"])
    assert (rec.endpoint, rec.status, rec.completion_tokens, rec.usage_source) == ("responses", "ok", 4, "engine")
    assert usage.output_tokens == 4 and rec.ttft_ms is not None


@pytest.mark.parametrize("stream", [False, True])
def test_function_calls_are_translated(gateway: Gateway, stream: bool) -> None:
    client = gateway.openai()
    args: Any = {"model": "flagship", "input": "find it", "tools": [TOOL], "max_output_tokens": 3,
                 "tool_choice": {"type": "function", "name": "lookup"}, "metadata": {"fake_tool_call": "lookup"}}
    if not stream:
        item = client.responses.create(**args).output[0]
    else:
        events: list[Any] = list(client.responses.create(**args, stream=True))
        deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
        item = events[-1].response.output[0]
        assert deltas == item.arguments
    assert item.type == "function_call" and item.name == "lookup" and item.arguments == '{"q": "w0 w1 w2 "}'


def test_a_function_call_and_its_output_become_chat_turns() -> None:
    body = {"model": "m", "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "q"}]},
        {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "found"}],
        "tool_choice": {"type": "function", "name": "lookup"}, "tools": [TOOL],
        "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}}}
    chat = chat_request(body, "pool")
    assert chat["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "q"}]},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "found"}]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "lookup"}}
    assert chat["tools"][0]["function"]["name"] == "lookup"
    schema = {"name": "x", "schema": {"type": "object"}}
    assert chat["response_format"] == {"type": "json_schema", "json_schema": schema}


@pytest.mark.parametrize(("extra", "param"), [({"store": True}, "store"),
                                               ({"tools": [{"type": "web_search"}]}, "tools[0].type")])
def test_what_a_chat_only_pool_cannot_do_is_refused(gateway: Gateway, fake_upstreams: Upstreams,
                                                    extra: dict[str, Any], param: str) -> None:
    client = gateway.openai()
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="flagship", input="hi", **extra)
    body: Any = caught.value.body
    assert body["param"] == param and "chat completions only" in body["message"]
    assert fake_upstreams[2].requests == 0
    assert gateway.client.post("/v1/responses", json={"model": "micro", "input": "x", **extra},
                      timeout=10).status_code == 200  # a native pool takes both
