"""The gateway in front of fake engines: routing, headers, errors, accounting. In-process (`tests.harness`), but for
the client leaving mid-stream, which needs bytes arriving over time (a uvicorn server and engines on ports)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import openai
import orjson
import pytest

from gateway.api.auth import hash_key
from tests.conftest import GatewayFactory, Upstreams, policy_yaml
from tests.harness import Gateway

DEAD = "http://dead.engine.test"  # no engine there: the connection is refused


@pytest.fixture
def gateway(make_gateway: GatewayFactory, fake_policy_file: Path) -> Gateway:
    return make_gateway(fake_policy_file, probe_interval_s=0.2)


def test_openai_sdk_non_streaming_routes_short_prompt_to_micro(gateway: Gateway) -> None:
    client = gateway.openai()
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
    ledger = gateway.ledger
    gateway.records(1)
    rec = ledger.records[raw.headers["x-request-id"]]
    assert (rec.pool, rec.prompt_tokens, rec.completion_tokens) == ("micro", resp.usage.prompt_tokens, 8)
    assert rec.cost_micro_usd == (rec.prompt_tokens * 200_000 + 8 * 200_000 + 500_000) // 1_000_000
    assert rec.flagship_cost_micro_usd > rec.cost_micro_usd


def test_long_prompt_goes_to_flagship_and_streams_usage(gateway: Gateway) -> None:
    client = gateway.openai()
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
    ledger = gateway.ledger
    gateway.records(1)
    rec = next(iter(ledger.records.values()))
    assert (rec.pool, rec.completion_tokens, rec.status, rec.usage_source) == ("flagship", 16, "ok", "engine")
    assert rec.ttft_ms is not None


def test_usage_chunk_hidden_unless_asked_but_still_recorded(gateway: Gateway) -> None:
    client = gateway.openai()
    chunks = list(client.chat.completions.create(model="micro", messages=[{"role": "user", "content": "x"}],
                                                 stream=True))
    assert all(c.usage is None for c in chunks)
    ledger = gateway.ledger
    gateway.records(1)
    assert next(iter(ledger.records.values())).completion_tokens == 16


def test_pinned_model_and_unknown_model(gateway: Gateway) -> None:
    client = gateway.openai()
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
def test_bad_input_gets_openai_error(gateway: Gateway, body: bytes, status: int, param: str | None) -> None:
    resp = gateway.client.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert resp.status_code == status
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error"
    if param is not None:
        assert err["param"] is not None and err["param"].startswith(param.split(".str")[0])
    assert resp.headers["x-request-id"]


def test_body_too_large_and_unknown_route(gateway: Gateway) -> None:
    big = b'{"model":"auto","messages":[{"role":"user","content":"' + b"a" * (2 << 20) + b'"}]}'
    resp = gateway.client.post("/v1/chat/completions", content=big)
    assert resp.status_code == 413 and resp.json()["error"]["code"] == "request_too_large"
    resp = gateway.client.get("/v1/nothing")
    assert resp.status_code == 404 and "error" in resp.json()


def test_health_and_readiness(gateway: Gateway) -> None:
    assert gateway.client.get("/healthz").json() == {"status": "ok"}
    ready = gateway.client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["pools"] == {"micro": True, "flagship": True}
    assert ready.json()["status"] == "ready" and ready.json()["reasons"] == []


def test_dead_engine_gives_503_not_500(tmp_path: Path, make_gateway: GatewayFactory,
                                       fake_upstreams: Upstreams) -> None:
    _, micro_url, _, _ = fake_upstreams
    path = tmp_path / "p.yaml"
    path.write_text(policy_yaml(micro_url, DEAD))
    gateway = make_gateway(path, scorer="none")
    resp = gateway.client.post("/v1/chat/completions",
                               json={"model": "flagship", "messages": [{"role": "user", "content": "x"}]})
    assert resp.status_code == 503
    assert resp.json()["error"]["code"] == "engine_unavailable"
    ready = gateway.client.get("/readyz")  # a remote pool is optional for readiness: degraded, still ready
    assert ready.status_code == 200 and ready.json()["degraded"] == ["flagship"]
    assert ready.json()["reasons"] == [
            "optional pool 'flagship' has no ready replica; the other pools serve meanwhile (its progress: engines)"]


def test_failover_to_live_replica(tmp_path: Path, make_gateway: GatewayFactory, fake_upstreams: Upstreams) -> None:
    micro, micro_url, _, flagship_url = fake_upstreams
    path = tmp_path / "p.yaml"
    text = policy_yaml(micro_url, flagship_url)
    path.write_text(text.replace(f'urls: ["{micro_url}"]', f'urls: ["{DEAD}", "{micro_url}"]'))
    gateway = make_gateway(path, scorer="none")
    runtime = gateway.runtime
    runtime.pools["micro"].replicas[0].healthy = True  # pretend it looked alive at the last probe
    runtime.pools["micro"].replicas[0].in_flight = -10  # and least loaded, so it is chosen first
    resp = gateway.client.post("/v1/chat/completions",
                               json={"model": "micro", "messages": [{"role": "user", "content": "x"}]})
    assert resp.status_code == 200
    assert micro.requests == 1
    assert runtime.pools["micro"].replicas[0].healthy is False


async def test_client_disconnect_mid_stream_is_charged_for_what_was_generated(
    make_gateway: GatewayFactory, policy_file: Path, upstreams: Upstreams
) -> None:
    """The fake engine sends a 4-character token every 0.3 s; the client leaves after the third. The record is
    charged exactly the three tokens the client was sent (the gateway noticed before a fourth came). End to end:
    the gateway on a server and the engine on a port, so that the tokens arrive over time."""
    gateway = make_gateway(policy_file, served=True, probe_interval_s=0.2)
    micro = upstreams[0]
    micro.content = "abcd" * 50  # 4 characters a token, as the gateway's estimate counts
    body = {"model": "micro", "messages": [{"role": "user", "content": "one two three"}], "stream": True,
            "metadata": {"fake_delay_ms": "300"}}
    received: list[str] = []
    chat = gateway.url + "/v1/chat/completions"
    async with httpx.AsyncClient() as client, client.stream("POST", chat, json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                received += [c["delta"]["content"] for c in orjson.loads(line[6:])["choices"]
                             if c["delta"].get("content")]
            if len(received) >= 3:
                break
    ledger = gateway.ledger
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


def test_metrics_count_what_the_ledger_records(gateway: Gateway) -> None:
    client = gateway.openai()
    client.chat.completions.create(model="micro", messages=[{"role": "user", "content": "a b"}], max_tokens=4)
    list(client.chat.completions.create(model="flagship", messages=[{"role": "user", "content": "a"}], stream=True))
    gateway.client.post("/v1/chat/completions", content=b"{")
    gateway.records(2)
    text = gateway.client.get("/metrics").text
    pools = gateway.runtime.pool_set.pools
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
    assert [r.ttft_ms for r in gateway.ledger.records.values() if r.pool == "micro"] == [None]
    itl = f'cascade_inter_token_seconds_count{{pool="flagship",version="{flagship}"}} '
    gaps = next(float(line.removeprefix(itl)) for line in text.splitlines() if line.startswith(itl))
    assert gaps <= 15  # a gap per token after the first network chunk: the zero-latency engine's come in one or few
    assert "cascade_replica_healthy{" in text and "cascade_gateway_overhead_seconds_bucket" in text


def test_failover_to_the_other_tier_when_the_policy_allows(tmp_path: Path, make_gateway: GatewayFactory,
                                                           fake_upstreams: Upstreams) -> None:
    _, micro_url, _, _ = fake_upstreams
    path = tmp_path / "p.yaml"
    path.write_text(policy_yaml(micro_url, DEAD).replace("threshold: 0.5", "threshold: 0.5\n  failover: true"))
    client = make_gateway(path).client
    hard = {"model": "auto", "messages": [{"role": "user", "content": "explain " * 150}]}
    r = client.post("/v1/chat/completions", json=hard)
    assert r.status_code == 200
    assert (r.headers["x-cascade-pool"], r.headers["x-cascade-rule"]) == ("micro", "failover")
    assert r.headers["x-cascade-route"] == "score:flagship, failover:micro"
    pinned = client.post("/v1/chat/completions", json={**hard, "model": "flagship"})
    assert pinned.status_code == 503  # a pinned model is never swapped


def test_failover_does_not_move_a_tenant_to_a_pool_it_may_not_use(tmp_path: Path, make_gateway: GatewayFactory,
                                                                  fake_upstreams: Upstreams) -> None:
    _, _, _, flagship_url = fake_upstreams
    path = tmp_path / "p.yaml"
    tenants = f"""tenants:
  small: {{api_key_sha256: ['{hash_key("sk-small")}'], allowed_pools: [micro, flagship]}}
  micro-only: {{api_key_sha256: ['{hash_key("sk-micro")}'], allowed_pools: [micro]}}
"""
    path.write_text(policy_yaml(DEAD, flagship_url).replace("threshold: 0.5", "threshold: 0.5\n  failover: true")
                    + tenants)
    client = make_gateway(path).client
    easy = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}
    moved = client.post("/v1/chat/completions", json=easy, headers={"authorization": "Bearer sk-small"})
    assert moved.status_code == 200 and moved.headers["x-cascade-pool"] == "flagship"
    held = client.post("/v1/chat/completions", json=easy, headers={"authorization": "Bearer sk-micro"})
    assert held.status_code == 503  # its only pool has no replica; the flagship is not its to use


def test_client_request_ids_cannot_make_requests_free(gateway: Gateway) -> None:
    body = {"model": "micro", "messages": [{"role": "user", "content": "x"}]}
    ids = set()
    for _ in range(3):
        r = gateway.client.post("/v1/chat/completions", json=body, headers={"x-request-id": "same-id"})
        assert r.headers["x-client-request-id"] == "same-id"
        ids.add(r.headers["x-request-id"])
    assert len(ids) == 3 and "same-id" not in ids
    gateway.records(3)  # three records: each request is charged
