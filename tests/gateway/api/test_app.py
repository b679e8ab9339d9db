"""The gateway over real HTTP (uvicorn) in front of fake engines: routing, headers, errors, accounting."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest

from gateway.api.app import create_app
from gateway.api.auth import hash_key
from gateway.api.runtime import Runtime
from gateway.ledger.store import MemoryLedger
from gateway.settings import Settings
from loadtest.fake_upstream import FakeUpstream
from tests.conftest import policy_yaml
from tests.servers import free_port, serve

Upstreams = tuple[FakeUpstream, str, FakeUpstream, str]


@pytest.fixture
def gateway(policy_file: Path, tmp_path: Path) -> Iterator[tuple[str, Any]]:
    settings = Settings(policy_path=policy_file, scorer="length", start_engines=False, ledger="memory",
                        home=tmp_path, probe_interval_s=0.2)
    app = create_app(settings)
    with serve(app) as url:
        yield url, app


def _ledger(app: Any) -> MemoryLedger:
    runtime: Runtime = app.state.runtime
    assert isinstance(runtime.ledger, MemoryLedger)
    return runtime.ledger


def _wait_records(ledger: MemoryLedger, n: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while len(ledger.records) < n and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(ledger.records) == n


def test_openai_sdk_non_streaming_routes_short_prompt_to_micro(gateway: tuple[str, Any]) -> None:
    url, app = gateway
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
    raw = client.chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": "hi there"}], max_tokens=8
    )
    resp = raw.parse()
    assert raw.headers["x-cascade-pool"] == "micro"
    assert raw.headers["x-cascade-rule"] == "threshold"
    assert float(raw.headers["x-cascade-score"]) < 0.5
    assert raw.headers["x-cascade-scored-by"] == "length"
    assert raw.headers["x-request-id"]
    assert resp.usage is not None and resp.usage.completion_tokens == 8
    ledger = _ledger(app)
    _wait_records(ledger, 1)
    rec = ledger.records[raw.headers["x-request-id"]]
    assert (rec.pool, rec.prompt_tokens, rec.completion_tokens) == ("micro", resp.usage.prompt_tokens, 8)
    assert rec.cost_micro_usd == (rec.prompt_tokens * 200_000 + 8 * 200_000 + 500_000) // 1_000_000
    assert rec.flagship_cost_micro_usd > rec.cost_micro_usd


def test_long_prompt_goes_to_flagship_and_streams_usage(gateway: tuple[str, Any]) -> None:
    url, app = gateway
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
    words = " ".join(["explain"] * 150)
    with client.chat.completions.with_streaming_response.create(
        model="auto", messages=[{"role": "user", "content": words}], stream=True,
        stream_options={"include_usage": True},
    ) as raw:
        assert raw.headers["x-cascade-pool"] == "flagship"
        chunks = list(raw.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.split() == [f"w{i}" for i in range(16)]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 16
    ledger = _ledger(app)
    _wait_records(ledger, 1)
    rec = next(iter(ledger.records.values()))
    assert (rec.pool, rec.completion_tokens, rec.status, rec.usage_source) == ("flagship", 16, "ok", "engine")
    assert rec.ttft_ms is not None


def test_usage_chunk_hidden_unless_asked_but_still_recorded(gateway: tuple[str, Any]) -> None:
    url, app = gateway
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
    chunks = list(client.chat.completions.create(model="micro", messages=[{"role": "user", "content": "x"}],
                                                 stream=True))
    assert all(c.usage is None for c in chunks)
    ledger = _ledger(app)
    _wait_records(ledger, 1)
    assert next(iter(ledger.records.values())).completion_tokens == 16


def test_pinned_model_and_unknown_model(gateway: tuple[str, Any]) -> None:
    url, _ = gateway
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
    raw = client.chat.completions.with_raw_response.create(
        model="flagship", messages=[{"role": "user", "content": "hi"}]
    )
    assert raw.headers["x-cascade-pool"] == "flagship" and raw.headers["x-cascade-rule"] == "pinned"
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "hi"}])
    assert err.value.body["code"] == "model_not_found"  # type: ignore[index]
    assert [m.id for m in client.models.list()] == ["auto", "micro", "flagship"]


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (b"{not json", 400, None),
        (b"[]", 400, None),
        (b'{"model": "auto"}', 400, "messages"),
        (b'{"model": "auto", "messages": []}', 400, "messages"),
        (b'{"model": "auto", "messages": [{"role": "wizard", "content": "x"}]}', 400, "messages[0].role"),
        (b'{"model": "auto", "messages": [{"role": "user", "content": 5}]}', 400, "messages[0].content.str"),
        (b'{"model": "auto", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}', 400, "max_tokens"),
        (b'{"model": 7, "messages": [{"role": "user", "content": "x"}]}', 400, "model"),
        (b'{"model": "auto", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}', 400, "stream"),
    ],
)
def test_bad_input_gets_openai_error(gateway: tuple[str, Any], body: bytes, status: int, param: str | None) -> None:
    url, _ = gateway
    resp = httpx.post(url + "/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert resp.status_code == status
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error"
    if param is not None:
        assert err["param"] is not None and err["param"].startswith(param.split(".str")[0])
    assert resp.headers["x-request-id"]


def test_body_too_large_and_unknown_route(gateway: tuple[str, Any]) -> None:
    url, _ = gateway
    big = b'{"model":"auto","messages":[{"role":"user","content":"' + b"a" * (2 << 20) + b'"}]}'
    resp = httpx.post(url + "/v1/chat/completions", content=big)
    assert resp.status_code == 413 and resp.json()["error"]["code"] == "request_too_large"
    resp = httpx.get(url + "/v1/nothing")
    assert resp.status_code == 404 and "error" in resp.json()


def test_health_and_readiness(gateway: tuple[str, Any]) -> None:
    url, _ = gateway
    assert httpx.get(url + "/healthz").json() == {"status": "ok"}
    ready = httpx.get(url + "/readyz")
    assert ready.status_code == 200 and ready.json()["pools"] == {"micro": True, "flagship": True}


def test_dead_engine_gives_503_not_500(tmp_path: Path, upstreams: Upstreams) -> None:
    _, micro_url, _, _ = upstreams
    path = tmp_path / "p.yaml"
    path.write_text(policy_yaml(micro_url, f"http://127.0.0.1:{free_port()}"))
    settings = Settings(policy_path=path, scorer="none", start_engines=False, ledger="memory", home=tmp_path)
    with serve(create_app(settings)) as url:
        resp = httpx.post(url + "/v1/chat/completions",
                          json={"model": "flagship", "messages": [{"role": "user", "content": "x"}]})
        assert resp.status_code == 503
        assert resp.json()["error"]["code"] == "engine_unavailable"
        ready = httpx.get(url + "/readyz")  # a remote pool is optional for readiness: degraded, still ready
        assert ready.status_code == 200 and ready.json()["degraded"] == ["flagship"]


def test_failover_to_live_replica(tmp_path: Path, upstreams: Upstreams) -> None:
    micro, micro_url, _, flagship_url = upstreams
    dead = f"http://127.0.0.1:{free_port()}"
    path = tmp_path / "p.yaml"
    text = policy_yaml(micro_url, flagship_url)
    path.write_text(text.replace(f'urls: ["{micro_url}"]', f'urls: ["{dead}", "{micro_url}"]'))
    settings = Settings(policy_path=path, scorer="none", start_engines=False, ledger="memory", home=tmp_path)
    app = create_app(settings)
    with serve(app) as url:
        runtime: Runtime = app.state.runtime
        runtime.pools["micro"].replicas[0].healthy = True  # pretend it looked alive at the last probe
        runtime.pools["micro"].replicas[0].in_flight = -10  # and least loaded, so it is chosen first
        resp = httpx.post(url + "/v1/chat/completions",
                          json={"model": "micro", "messages": [{"role": "user", "content": "x"}]})
        assert resp.status_code == 200
        assert micro.requests == 1
        assert runtime.pools["micro"].replicas[0].healthy is False


async def test_client_disconnect_mid_stream_is_charged_for_what_was_generated(
    gateway: tuple[str, Any], upstreams: Upstreams
) -> None:
    """The fake engine sends a 4-character token every 0.3 s; the client leaves after the third. The record is
    charged exactly the three tokens the client was sent (the gateway noticed before a fourth came)."""
    url, app = gateway
    micro = upstreams[0]
    micro.content = "abcd" * 50  # 4 characters a token, as the gateway's estimate counts
    body = {"model": "micro", "messages": [{"role": "user", "content": "one two three"}], "stream": True,
            "metadata": {"fake_delay_ms": "300"}}
    received: list[str] = []
    async with httpx.AsyncClient() as client, client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                received += [c["delta"]["content"] for c in orjson.loads(line[6:])["choices"]
                             if c["delta"].get("content")]
            if len(received) >= 3:
                break
    ledger = _ledger(app)
    deadline = time.monotonic() + 5
    while not ledger.records and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    rec = next(iter(ledger.records.values()))
    assert rec.status == "client_disconnect"
    # a remote pool with no tokenizer of its own: estimated here, the prompt is not sent anywhere to be counted
    assert rec.usage_source == "estimate" and micro.tokenize_requests == 0
    assert rec.prompt_tokens == len("one two three") // 4
    assert received == ["abcd"] * 3 and rec.completion_tokens == 3  # what the client was sent, not max_tokens
    deadline = time.monotonic() + 5
    while micro.aborted == 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert micro.aborted == 1  # the engine request was aborted, not left generating


def test_metrics_count_what_the_ledger_records(gateway: tuple[str, Any]) -> None:
    url, app = gateway
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
    client.chat.completions.create(model="micro", messages=[{"role": "user", "content": "a b"}], max_tokens=4)
    list(client.chat.completions.create(model="flagship", messages=[{"role": "user", "content": "a"}], stream=True))
    httpx.post(url + "/v1/chat/completions", content=b"{")
    _wait_records(_ledger(app), 2)
    text = httpx.get(url + "/metrics").text
    pools = app.state.runtime.pool_set.pools
    micro, flagship = pools["micro"].version, pools["flagship"].version
    assert micro and flagship and micro != flagship  # each answer names the engine version that gave it
    assert ('cascade_requests_total{pool="micro",rule="pinned",status="ok",tenant="default",'
            f'version="{micro}"}} 1.0') in text
    assert 'cascade_requests_total{pool="none",rule="none",status="400",tenant="default",version="none"} 1.0' in text
    assert 'cascade_tokens_total{kind="completion",pool="micro"} 4.0' in text
    assert f'cascade_ttft_seconds_count{{pool="flagship",version="{flagship}"}} 1.0' in text
    # the JSON answer: its time to the engine's answer, kept out of TTFT (which reads first tokens) and its record's
    assert f'cascade_first_byte_seconds_count{{pool="micro",version="{micro}"}} 1.0' in text
    assert 'cascade_ttft_seconds_count{pool="micro"' not in text
    assert [r.ttft_ms for r in _ledger(app).records.values() if r.pool == "micro"] == [None]
    itl = f'cascade_inter_token_seconds_count{{pool="flagship",version="{flagship}"}} '
    gaps = next(float(line.removeprefix(itl)) for line in text.splitlines() if line.startswith(itl))
    assert gaps <= 15  # a gap per token after the first network chunk: the zero-latency engine's come in one or few
    assert "cascade_replica_healthy{" in text and "cascade_gateway_overhead_seconds_bucket" in text


def test_failover_to_the_other_tier_when_the_policy_allows(tmp_path: Path, upstreams: Upstreams) -> None:
    _, micro_url, _, _ = upstreams
    dead = f"http://127.0.0.1:{free_port()}"
    path = tmp_path / "p.yaml"
    path.write_text(policy_yaml(micro_url, dead).replace("threshold: 0.5", "threshold: 0.5\n  failover: true"))
    settings = Settings(policy_path=path, scorer="length", start_engines=False, ledger="memory", home=tmp_path)
    with serve(create_app(settings)) as url:
        hard = {"model": "auto", "messages": [{"role": "user", "content": "explain " * 150}]}
        r = httpx.post(url + "/v1/chat/completions", json=hard)
        assert r.status_code == 200
        assert (r.headers["x-cascade-pool"], r.headers["x-cascade-rule"]) == ("micro", "failover")
        assert r.headers["x-cascade-route"] == "score:flagship, failover:micro"
        pinned = httpx.post(url + "/v1/chat/completions", json={**hard, "model": "flagship"})
        assert pinned.status_code == 503  # a pinned model is never swapped


def test_failover_does_not_move_a_tenant_to_a_pool_it_may_not_use(tmp_path: Path, upstreams: Upstreams) -> None:
    _, _, _, flagship_url = upstreams
    dead = f"http://127.0.0.1:{free_port()}"
    path = tmp_path / "p.yaml"
    tenants = f"""tenants:
  small: {{api_key_sha256: ['{hash_key("sk-small")}'], allowed_pools: [micro, flagship]}}
  micro-only: {{api_key_sha256: ['{hash_key("sk-micro")}'], allowed_pools: [micro]}}
"""
    path.write_text(policy_yaml(dead, flagship_url).replace("threshold: 0.5", "threshold: 0.5\n  failover: true")
                    + tenants)
    settings = Settings(policy_path=path, scorer="length", start_engines=False, ledger="memory", home=tmp_path)
    easy = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}
    with serve(create_app(settings)) as url:
        moved = httpx.post(url + "/v1/chat/completions", json=easy, headers={"authorization": "Bearer sk-small"})
        assert moved.status_code == 200 and moved.headers["x-cascade-pool"] == "flagship"
        held = httpx.post(url + "/v1/chat/completions", json=easy, headers={"authorization": "Bearer sk-micro"})
        assert held.status_code == 503  # its only pool has no replica; the flagship is not its to use


def test_client_request_ids_cannot_make_requests_free(gateway: tuple[str, Any]) -> None:
    url, app = gateway
    body = {"model": "micro", "messages": [{"role": "user", "content": "x"}]}
    ids = set()
    for _ in range(3):
        r = httpx.post(url + "/v1/chat/completions", json=body, headers={"x-request-id": "same-id"})
        assert r.headers["x-client-request-id"] == "same-id"
        ids.add(r.headers["x-request-id"])
    assert len(ids) == 3 and "same-id" not in ids
    _wait_records(_ledger(app), 3)  # three records: each request is charged
