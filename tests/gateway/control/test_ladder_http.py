"""Each degradation-ladder step through the gateway in-process (`tests.harness`), driven by the engines' own
/metrics (fakes whose KV-cache use and queue depth we set), engaging and receding with hysteresis."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.api.auth import hash_key
from loadtest.fake_upstream import FakeUpstream
from tests.conftest import GatewayFactory, Upstreams, policy_yaml
from tests.harness import Gateway
from tests.servers import until

TENANTS = f"""tenants:
  gold: {{api_key_sha256: ['{hash_key("sk-gold")}'], priority: 5}}
  free: {{api_key_sha256: ['{hash_key("sk-free")}'], priority: 0}}
"""
STEP = """  - name: {name}
    signal: {signal}
    pool: flagship
    enter_above: {enter}
    exit_below: {exit}
    hold_s: 0
    action: {action}
"""


Build = Callable[..., Gateway]


@pytest.fixture
def build(make_gateway: GatewayFactory, tmp_path: Path, fake_upstreams: Upstreams) -> Build:
    """`build(step, extra)`: a gateway in-process over `fake_upstreams` with the ladder step `step`."""

    def make(step: str, extra: str = "") -> Gateway:
        _, micro_url, _, flagship_url = fake_upstreams
        path = tmp_path / "policy.yaml"
        path.write_text(policy_yaml(micro_url, flagship_url) + "degradation:\n  steps:\n" + step + extra)
        return make_gateway(path, probe_interval_s=0.1)

    return make


def _post(gateway: Gateway, **body: Any) -> httpx.Response:
    payload = {"model": "auto", "messages": [{"role": "user", "content": "hello there"}], **body}
    return gateway.client.post("/v1/chat/completions", json=payload, headers=body.pop("headers", None), timeout=10)


@pytest.fixture
def fallback(build: Build) -> Gateway:
    action = "{type: fallback_pool, to_pool: micro}"
    return build(STEP.format(name="kv-high", signal="kv_cache_usage", enter=0.85, exit=0.5, action=action))


def test_fallback_engages_on_kv_cache_and_recedes(fallback: Gateway, fake_upstreams: Upstreams) -> None:
    flagship = fake_upstreams[2]
    assert _post(fallback, model="flagship").headers["x-cascade-pool"] == "flagship"
    flagship.kv_cache_usage = 0.9
    until(lambda: _post(fallback, model="flagship").headers["x-cascade-pool"] == "micro")
    r = _post(fallback, model="flagship")
    assert r.headers["x-cascade-rule"] == "ladder:kv-high" and r.headers["x-cascade-degraded"] == "kv-high"
    flagship.kv_cache_usage = 0.7  # between exit and enter: hysteresis keeps the step on
    time.sleep(0.5)
    assert _post(fallback, model="flagship").headers["x-cascade-pool"] == "micro"
    flagship.kv_cache_usage = 0.2
    until(lambda: _post(fallback, model="flagship").headers["x-cascade-pool"] == "flagship")
    assert "x-cascade-degraded" not in _post(fallback, model="flagship").headers


@pytest.fixture
def truncating(build: Build) -> Gateway:
    action = "{type: truncate_context, max_tokens: 20}"
    return build(STEP.format(name="trunc", signal="queue_depth", enter=5, exit=1, action=action))


def test_truncation_keeps_system_and_latest_turns(truncating: Gateway, fake_upstreams: Upstreams) -> None:
    messages = [{"role": "system", "content": "be brief"}] + [
        {"role": "user" if i % 2 == 0 else "assistant", "content": "word " * 30} for i in range(6)
    ] + [{"role": "user", "content": "last question"}]
    full = _post(truncating, model="flagship", messages=messages).json()["usage"]["prompt_tokens"]
    fake_upstreams[2].waiting = 10
    until(lambda: "x-cascade-truncated" in _post(truncating, model="flagship", messages=messages).headers)
    r = _post(truncating, model="flagship", messages=messages)
    assert int(r.headers["x-cascade-truncated"]) == 6
    assert r.json()["usage"]["prompt_tokens"] == (3 + 2) + (3 + 2)  # system + last question (fake tokenizer)
    assert r.json()["usage"]["prompt_tokens"] < full
    micro = _post(truncating, model="micro", messages=messages)  # scope: pool: only the flagship's requests are cut
    assert "x-cascade-truncated" not in micro.headers and micro.json()["usage"]["prompt_tokens"] == full


@pytest.fixture
def shedding(build: Build) -> Gateway:
    action = "{type: shed, below_priority: 1, retry_after_s: 7}"
    return build(STEP.format(name="shed", signal="queue_depth", enter=5, exit=1, action=action), TENANTS)


def test_shedding_rejects_low_priority_with_retry_after(shedding: Gateway, fake_upstreams: Upstreams) -> None:
    gold, free = {"authorization": "Bearer sk-gold"}, {"authorization": "Bearer sk-free"}
    assert _post(shedding, model="flagship", headers=free).status_code == 200
    fake_upstreams[2].waiting = 10
    until(lambda: _post(shedding, model="flagship", headers=free).status_code == 429)
    r = _post(shedding, model="flagship", headers=free)
    assert r.headers["retry-after"] == "7" and r.json()["error"]["code"] == "load_shed"
    assert _post(shedding, model="flagship", headers=gold).status_code == 200
    micro = _post(shedding, headers=free)  # scope: pool (the default): a queue on the flagship spares micro traffic
    assert (micro.status_code, micro.headers["x-cascade-pool"]) == (200, "micro")
    assert micro.headers["x-cascade-degraded"] == "shed"
    fake_upstreams[2].waiting = 0
    until(lambda: _post(shedding, model="flagship", headers=free).status_code == 200)


@pytest.fixture
def shedding_everyone(build: Build) -> Gateway:
    action = "{type: shed, below_priority: 1, retry_after_s: 7}\n    scope: all"
    return build(STEP.format(name="shed", signal="queue_depth", enter=5, exit=1, action=action), TENANTS)


def test_shedding_with_scope_all_rejects_micro_traffic_too(shedding_everyone: Gateway,
                                                           fake_upstreams: Upstreams) -> None:
    free = {"authorization": "Bearer sk-free"}
    assert _post(shedding_everyone, headers=free).headers["x-cascade-pool"] == "micro"
    fake_upstreams[2].waiting = 10
    until(lambda: _post(shedding_everyone, headers=free).status_code == 429)
    served = fake_upstreams[0].requests  # micro requests answered before the step engaged
    assert _post(shedding_everyone, headers=free).json()["error"]["code"] == "load_shed"
    assert fake_upstreams[0].requests == served  # shed before any engine call


@pytest.fixture
def shedding_on_in_flight(build: Build) -> Gateway:
    action = "{type: shed, below_priority: 1, retry_after_s: 3}"
    return build(STEP.format(name="busy", signal="in_flight", enter=3, exit=1, action=action), TENANTS)


def test_shedding_on_the_gateways_own_in_flight_requests(shedding_on_in_flight: Gateway) -> None:
    """No engine gauge moves here: the step sees the slow requests the gateway itself has open."""
    gateway = shedding_on_in_flight
    gold, free = {"authorization": "Bearer sk-gold"}, {"authorization": "Bearer sk-free"}
    assert _post(gateway, model="flagship", headers=free).status_code == 200
    slow = {"model": "flagship", "metadata": {"fake_delay_ms": "150"}, "headers": gold}
    with ThreadPoolExecutor(5) as pool:
        running = [pool.submit(_post, gateway, **slow) for _ in range(5)]  # 16 tokens x 150 ms each
        until(lambda: _post(gateway, model="flagship", headers=free).status_code == 429)
        r = _post(gateway, model="flagship", headers=free)
        assert r.headers["retry-after"] == "3" and r.json()["error"]["code"] == "load_shed"
        assert _post(gateway, model="flagship", headers=gold).status_code == 200  # higher priority is still served
        assert _post(gateway, headers=free).status_code == 200  # micro traffic is not the flagship's load
        assert all(f.result().status_code == 200 for f in running)
    until(lambda: _post(gateway, model="flagship", headers=free).status_code == 200)


@pytest.fixture
def forcing(build: Build) -> Gateway:
    action = "{type: force_stream}"
    return build(STEP.format(name="slow", signal="kv_cache_usage", enter=0.5, exit=0.2, action=action))


def test_force_stream_still_answers_json(forcing: Gateway, fake_upstreams: Upstreams) -> None:
    fake_upstreams[2].kv_cache_usage = 0.9
    until(lambda: "x-cascade-degraded" in _post(forcing, model="flagship").headers)
    r = _post(forcing, model="flagship", max_tokens=5)
    body = r.json()
    assert body["object"] == "chat.completion" and body["usage"]["completion_tokens"] == 5
    assert body["choices"][0]["message"]["content"].split() == ["w0", "w1", "w2", "w3", "w4"]


TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
TOOL_CALL = {"model": "flagship", "tools": TOOLS, "n": 2, "logprobs": True, "top_logprobs": 2, "max_tokens": 4,
             "metadata": {"fake_tool_call": "search"}}


def _forced(gateway: Gateway, flagship: FakeUpstream) -> None:
    flagship.kv_cache_usage = 0.9
    until(lambda: "x-cascade-degraded" in _post(gateway, model="flagship").headers)


async def _asked_directly(engine: FakeUpstream, body: dict[str, Any]) -> Any:
    """The engine's own JSON answer to `body`, asked without the gateway."""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(engine), base_url="http://engine") as client:
        return (await client.post("/v1/chat/completions", json=body)).json()


def test_force_stream_json_is_the_engines_own_answer(forcing: Gateway, fake_upstreams: Upstreams) -> None:
    """Tool calls, logprobs and every choice survive the assembly: the client gets what the engine answers
    when asked for JSON directly."""
    asked = {"messages": [{"role": "user", "content": "hello there"}], **TOOL_CALL, "model": "flagship-model"}
    direct = asyncio.run(_asked_directly(fake_upstreams[2], asked))
    _forced(forcing, fake_upstreams[2])
    r = _post(forcing, **TOOL_CALL)
    assert r.status_code == 200 and r.headers["x-cascade-degraded"] == "slow"
    body = r.json()
    assert body["choices"] == direct["choices"] and body["usage"] == direct["usage"]
    calls = [c["message"]["tool_calls"][0] for c in body["choices"]]
    assert [c["id"] for c in calls] == ["call_fake_0", "call_fake_1"]
    assert all(c["function"] == {"name": "search", "arguments": '{"q": "w0 w1 w2 w3 "}'} for c in calls)
    assert body["choices"][0]["message"]["content"] is None
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    assert len(body["choices"][1]["logprobs"]["content"]) == 6  # open, 4 tokens, close
    assert body["usage"]["completion_tokens"] == 2 * 4  # both choices counted


def test_force_stream_streams_tool_calls_as_they_are_made(make_gateway: GatewayFactory, tmp_path: Path,
                                                          upstreams: Upstreams) -> None:
    """End to end (a server, engines on ports): the tool calls arrive over time."""
    _, micro_url, _, flagship_url = upstreams
    path = tmp_path / "served.yaml"
    step = STEP.format(name="slow", signal="kv_cache_usage", enter=0.5, exit=0.2, action="{type: force_stream}")
    path.write_text(policy_yaml(micro_url, flagship_url) + "degradation:\n  steps:\n" + step)
    forcing = make_gateway(path, served=True, probe_interval_s=0.1)
    _forced(forcing, upstreams[2])
    slow = dict(TOOL_CALL, n=1, stream=True, metadata={"fake_tool_call": "search", "fake_delay_ms": "150"})
    payload = {"messages": [{"role": "user", "content": "hello there"}], **slow}
    began, arrivals, arguments = time.monotonic(), [], ""
    with httpx.stream("POST", forcing.url + "/v1/chat/completions", json=payload, timeout=10) as r:
        assert r.headers["x-cascade-degraded"] == "slow"
        for line in r.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    for call in choice["delta"].get("tool_calls") or ():
                        arrivals.append(time.monotonic() - began)
                        arguments += call["function"]["arguments"]
    assert arguments == '{"q": "w0 w1 w2 w3 "}'
    assert len(arrivals) == 6 and arrivals[0] < arrivals[-1] - 0.5  # 5 gaps of 150 ms: not one burst at the end


@pytest.fixture
def raising(build: Build) -> Gateway:
    action = "{type: raise_threshold, threshold: 0.99}"
    return build(STEP.format(name="raise", signal="kv_cache_usage", enter=0.5, exit=0.2, action=action))


def test_raise_threshold_sends_borderline_requests_to_micro(raising: Gateway, fake_upstreams: Upstreams) -> None:
    long_prompt = [{"role": "user", "content": "explain " * 150}]  # length scorer: 0.75
    assert _post(raising, messages=long_prompt).headers["x-cascade-pool"] == "flagship"
    fake_upstreams[2].kv_cache_usage = 0.9
    until(lambda: _post(raising, messages=long_prompt).headers["x-cascade-pool"] == "micro")
    assert _post(raising, messages=long_prompt).headers["x-cascade-rule"] == "ladder:raise"


@pytest.fixture
def overflowing(make_gateway: GatewayFactory, tmp_path: Path, fake_upstreams: Upstreams,
                monkeypatch: pytest.MonkeyPatch) -> Gateway:
    monkeypatch.setenv("CASCADE_TEST_CLOUD_KEY", "sk-cloud-123")
    cloud = f"""  cloud:
    type: remote
    urls: ["{fake_upstreams[3]}"]
    model: cloud-model
    api_key_env: CASCADE_TEST_CLOUD_KEY
    price: {{input_per_mtok: "5.00", output_per_mtok: "20.00"}}
"""
    _, micro_url, _, flagship_url = fake_upstreams
    path = tmp_path / "policy.yaml"
    text = policy_yaml(micro_url, flagship_url).replace("pools:\n", "pools:\n" + cloud, 1)
    step = STEP.format(name="burst", signal="queue_depth", enter=5, exit=1, action="{type: overflow, to_pool: cloud}")
    path.write_text(text + "degradation:\n  steps:\n" + step)
    return make_gateway(path, probe_interval_s=0.1)


def test_overflow_bursts_to_the_remote_pool_and_back(overflowing: Gateway, fake_upstreams: Upstreams) -> None:
    long_prompt = [{"role": "user", "content": "explain " * 150}]
    assert _post(overflowing, messages=long_prompt).headers["x-cascade-pool"] == "flagship"
    fake_upstreams[2].waiting = 10
    until(lambda: _post(overflowing, messages=long_prompt).headers["x-cascade-pool"] == "cloud")
    r = _post(overflowing, messages=long_prompt)
    assert r.headers["x-cascade-rule"] == "ladder:burst" and r.json()["model"] == "cloud-model"
    assert fake_upstreams[2].last_authorization == "Bearer sk-cloud-123"  # the remote pool's key, from its env var
    fake_upstreams[2].waiting = 0
    until(lambda: _post(overflowing, messages=long_prompt).headers["x-cascade-pool"] == "flagship")
