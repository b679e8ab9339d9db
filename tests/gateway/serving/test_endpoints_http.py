"""`/v1/responses` and `/v1/completions` in front of fake engines, with the official openai SDK: routed, recorded and
refused like chat, each record naming its endpoint. In-process (`tests.harness`), but for a client leaving a stream
(a uvicorn server and an engine on a port)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.conftest import GatewayFactory, Upstreams, policy_yaml
from tests.harness import Gateway


@pytest.fixture
def gateway(make_gateway: GatewayFactory, fake_policy_file: Path) -> Gateway:
    return make_gateway(fake_policy_file, probe_interval_s=0.2, max_tokens_cap=64)


def test_responses_create_is_routed_priced_and_recorded(gateway: Gateway, fake_upstreams: Upstreams) -> None:
    client = gateway.openai("unused")
    raw = client.responses.with_raw_response.create(model="auto", input="hi there", instructions="be brief",
                                                    max_output_tokens=6)
    resp = raw.parse()
    assert resp.output_text == " w0 w1 w2 w3 w4 w5"
    assert raw.headers["x-cascade-endpoint"] == "responses"
    assert raw.headers["x-cascade-pool"] == "micro"
    assert raw.headers["x-request-id"].startswith("req_resp_")
    assert fake_upstreams[0].requests == 1 and fake_upstreams[2].requests == 0
    rec = gateway.record(raw.headers["x-request-id"])
    assert resp.usage is not None
    assert (rec.endpoint, rec.pool, rec.status, rec.usage_source) == ("responses", "micro", "ok", "engine")
    assert (rec.prompt_tokens, rec.completion_tokens) == (resp.usage.input_tokens, 6)
    assert rec.cost_micro_usd == (rec.prompt_tokens * 200_000 + 6 * 200_000 + 500_000) // 1_000_000


def test_responses_input_items_are_scored_and_streamed_events_relayed(gateway: Gateway,
                                                                      fake_upstreams: Upstreams) -> None:
    client = gateway.openai("unused")
    long_turn: Any = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "explain " * 150}]}
    with client.responses.with_streaming_response.create(model="auto", input=[long_turn], stream=True,
                                                         max_output_tokens=5) as raw:
        assert raw.headers["x-cascade-pool"] == "flagship"  # the length scorer read the item's text
        events: list[Any] = list(raw.parse())
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert kinds.count("response.output_text.delta") == 5
    usage = events[-1].response.usage
    assert usage is not None
    rec = gateway.record(raw.headers["x-request-id"])
    assert (rec.endpoint, rec.pool, rec.prompt_tokens, rec.completion_tokens) == (
        "responses", "flagship", usage.input_tokens, 5)
    assert rec.ttft_ms is not None and fake_upstreams[2].requests == 1


def test_a_cancelled_responses_stream_is_charged_for_what_was_generated(make_gateway: GatewayFactory,
                                                                        policy_file: Path) -> None:
    """End to end (a server, an engine on a port): the client leaves while the tokens arrive."""
    gateway = make_gateway(policy_file, served=True, probe_interval_s=0.2, max_tokens_cap=64)
    body = {"model": "micro", "input": "hello", "stream": True, "metadata": {"fake_delay_ms": "30"}}
    with httpx.Client(timeout=10) as http, http.stream("POST", gateway.url + "/v1/responses", json=body) as resp:
        request_id = resp.headers["x-request-id"]
        seen = 0
        for line in resp.iter_lines():
            seen += line.startswith("event: response.output_text.delta")
            if seen == 3:
                break
    rec = gateway.record(request_id)
    assert (rec.endpoint, rec.status, rec.usage_source) == ("responses", "client_disconnect", "estimate")
    assert rec.completion_tokens >= 1 and rec.prompt_tokens >= 1


def test_completions_create_streams_and_token_arrays(gateway: Gateway) -> None:
    client = gateway.openai("unused")
    raw = client.completions.with_raw_response.create(model="auto", prompt="say hello", max_tokens=4)
    done = raw.parse()
    assert done.choices[0].text == " w0 w1 w2 w3" and raw.headers["x-cascade-endpoint"] == "completions"
    assert raw.headers["x-request-id"].startswith("req_cmpl_")
    rec = gateway.record(raw.headers["x-request-id"])
    assert done.usage is not None
    assert (rec.endpoint, rec.prompt_tokens, rec.completion_tokens) == ("completions", done.usage.prompt_tokens, 4)
    # streamed without include_usage: the client sees no usage chunk, the ledger still has the engine's usage
    with client.completions.with_streaming_response.create(model="micro", prompt=[5, 6, 7], max_tokens=3,
                                                           stream=True) as streamed:
        chunks = list(streamed.parse())
    assert "".join(c.choices[0].text for c in chunks if c.choices) == " w0 w1 w2"
    assert all(c.usage is None for c in chunks)
    rec = gateway.record(streamed.headers["x-request-id"])
    assert (rec.endpoint, rec.prompt_tokens, rec.completion_tokens, rec.usage_source) == ("completions", 3, 3,
                                                                                          "engine")


def test_the_token_cap_clamps_each_endpoints_own_limit(gateway: Gateway) -> None:
    client = gateway.openai("unused")
    resp = client.responses.create(model="micro", input="x", max_output_tokens=500, metadata={"fake_tokens": "99"})
    assert resp.usage is not None and resp.usage.output_tokens == 64
    done = client.completions.create(model="micro", prompt="x", extra_body={"metadata": {"fake_tokens": "99"}})
    assert done.usage is not None and done.usage.completion_tokens == 64


@pytest.mark.parametrize(("path", "body", "status", "param", "says"), [
    ("/v1/responses", {"model": "auto", "input": [{"type": "bogus_item"}]}, 400, "input[0].type", "bogus_item"),
    ("/v1/responses", {"model": "auto", "input": [5]}, 400, "input[0]", "must be an object"),
    ("/v1/responses", {"model": "auto", "input": [{"role": "wizard", "content": "x"}]}, 400, "input[0].role",
     "must be one of"),
    ("/v1/responses", {"model": "auto", "input": "x", "previous_response_id": "resp_1"}, 400,
     "previous_response_id", "whole conversation"),
    ("/v1/responses", {"model": "auto", "input": [{"type": "item_reference", "id": "msg_1"}]}, 400, "input[0]",
     "state"),
    ("/v1/responses", {"model": "auto", "input": "x", "background": True}, 400, "background", "state"),
    ("/v1/responses", {"model": "auto"}, 400, "input", "input"),
    ("/v1/responses", {"model": "nope", "input": "x"}, 404, "model", "nope"),
    ("/v1/completions", {"model": "auto"}, 400, "prompt", "required"),
    ("/v1/completions", {"model": "auto", "prompt": {"a": 1}}, 400, "prompt", "token ids"),
    ("/v1/completions", {"model": "auto", "prompt": "x", "max_tokens": 0}, 400, "max_tokens", "greater"),
])
def test_bad_requests_get_openai_errors_naming_the_field(gateway: Gateway, fake_upstreams: Upstreams, path: str,
                                                         body: dict[str, Any], status: int, param: str,
                                                         says: str) -> None:
    resp = gateway.client.post(path, json=body, timeout=10)
    assert resp.status_code == status, resp.text
    error = orjson.loads(resp.content)["error"]
    assert error["param"] == param and says in error["message"]
    assert resp.headers["x-request-id"].startswith("req_")
    assert fake_upstreams[0].requests == fake_upstreams[2].requests == 0


def test_metrics_count_each_endpoint(gateway: Gateway) -> None:
    client = gateway.openai("unused")
    ids = [client.responses.with_raw_response.create(model="micro", input="x").headers["x-request-id"],
           client.completions.with_raw_response.create(model="flagship", prompt="x").headers["x-request-id"],
           client.chat.completions.with_raw_response.create(
               model="micro", messages=[{"role": "user", "content": "x"}]).headers["x-request-id"]]
    costs = [gateway.record(request_id).cost_micro_usd for request_id in ids]
    text = gateway.client.get("/metrics", timeout=10).text
    for endpoint, pool, cost in zip(("responses", "completions", "chat"), ("micro", "flagship", "micro"), costs,
                                    strict=True):
        assert f'cascade_endpoint_requests_total{{endpoint="{endpoint}",pool="{pool}",status="ok"}} 1.0' in text
        assert f'cascade_endpoint_cost_micro_usd_total{{endpoint="{endpoint}",pool="{pool}"}} {float(cost)}' in text


def test_output_checks_judge_chat_answers_only(make_gateway: GatewayFactory, fake_upstreams: Upstreams,
                                               tmp_path: Path) -> None:
    _, micro_url, _, flagship_url = fake_upstreams
    policy = tmp_path / "checks.yaml"
    policy.write_text(policy_yaml(micro_url, flagship_url) + "output_checks: {empty: flag, repetition: flag}\n")
    gateway = make_gateway(policy, probe_interval_s=0.2)
    client = gateway.openai("unused")
    chat = client.chat.completions.with_raw_response.create(model="micro", messages=[{"role": "user",
                                                                                      "content": "x"}])
    assert "x-cascade-output-check" in chat.headers  # the checks are on
    for raw in (client.responses.with_raw_response.create(model="micro", input="x"),
                client.completions.with_raw_response.create(model="micro", prompt="x")):
        assert "x-cascade-output-check" not in raw.headers
        assert gateway.record(raw.headers["x-request-id"]).output_check == ""
    with client.responses.with_streaming_response.create(model="micro", input="x", stream=True) as streamed:
        assert list(streamed.parse())[-1].type == "response.completed"
    assert gateway.record(streamed.headers["x-request-id"]).output_check == ""
