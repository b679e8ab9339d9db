"""The true cascade in-process (`tests.harness`) over fake engines whose logprobs we control."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.api.auth import hash_key
from gateway.serving.sending.cascade import confidence
from tests.conftest import GatewayFactory, Upstreams, policy_yaml
from tests.harness import Gateway
from tests.servers import until

CASCADE = """  cascade: {enabled: true, min_confidence: 0.5, first_tokens: 4}"""


Build = Callable[..., Gateway]


@pytest.fixture
def build(make_gateway: GatewayFactory, tmp_path: Path, fake_upstreams: Upstreams) -> Build:
    """`build(extra, pools, **settings)`: a gateway over `fake_upstreams` whose policy cascades, with `extra` policy
    text after it and `pools` more pools."""

    def make(extra: str = "", pools: str = "", **settings: Any) -> Gateway:
        _, micro_url, _, flagship_url = fake_upstreams
        path = tmp_path / "policy.yaml"
        text = policy_yaml(micro_url, flagship_url, CASCADE).replace("pools:\n", "pools:\n" + pools, 1) + extra
        path.write_text(text)
        return make_gateway(path, **{"probe_interval_s": 0.1, **settings})

    return make


@pytest.fixture
def gateway(build: Build) -> Gateway:
    return build(probe_interval_s=1.0)


def test_confidence_is_geometric_mean_probability() -> None:
    assert confidence([]) is None
    assert confidence([0.0, 0.0]) == 1.0
    assert abs((confidence([-0.1, -0.3]) or 0) - 0.8187) < 1e-3


def _body(logprob: float, stream: bool) -> dict[str, Any]:
    return {"model": "auto", "messages": [{"role": "user", "content": "hi"}], "stream": stream,
            "metadata": {"fake_logprob": str(logprob), "fake_tokens": "8"}}


@pytest.mark.parametrize("stream", [False, True])
def test_confident_micro_answer_is_kept(gateway: Gateway, fake_upstreams: Upstreams, stream: bool) -> None:
    resp = gateway.client.post("/v1/chat/completions", json=_body(-0.1, stream))
    assert resp.status_code == 200
    assert (resp.headers["x-cascade-pool"], resp.headers["x-cascade-escalated"]) == ("micro", "false")
    assert float(resp.headers["x-cascade-confidence"]) == pytest.approx(0.905, abs=1e-3)
    if not stream:
        assert resp.json()["choices"][0]["logprobs"] is None  # the client did not ask for them
    else:
        assert resp.text.count("\"content\":\" w") == 8  # held-back probe tokens were replayed, none lost
    (rec,) = gateway.records(1).values()
    assert rec.pool == "micro" and rec.completion_tokens == 8
    assert fake_upstreams[2].requests == 0


@pytest.mark.parametrize("stream", [False, True])
def test_unsure_micro_answer_escalates_and_both_calls_are_charged(
    gateway: Gateway, fake_upstreams: Upstreams, stream: bool
) -> None:
    resp = gateway.client.post("/v1/chat/completions", json=_body(-3.0, stream))
    assert resp.status_code == 200
    assert (resp.headers["x-cascade-pool"], resp.headers["x-cascade-rule"]) == ("flagship", "cascade")
    assert resp.headers["x-cascade-route"] == "score:micro, cascade:flagship"
    assert resp.headers["x-cascade-escalated"] == "true"
    assert "flagship-model" in resp.text and "micro-model" not in resp.text  # no byte of the probe leaked
    rid = resp.headers["x-request-id"]
    records = gateway.records(2)
    probe, final = records[rid + "-probe"], records[rid]
    assert (probe.pool, probe.status) == ("micro", "escalated")
    # remote pools are counted here, 4 characters a token; the 4 probe tokens read are the floor (" w0" is 3)
    assert probe.completion_tokens >= 4
    assert (final.pool, final.status, final.rule) == ("flagship", "ok", "cascade")
    assert (probe.route, final.route) == ("score:micro", "score:micro, cascade:flagship")
    assert fake_upstreams[0].requests == 1 and fake_upstreams[2].requests == 1


NARROW = f"""tenants:
  narrow: {{api_key_sha256: ['{hash_key("sk-narrow")}'], allowed_pools: [micro]}}
  open: {{api_key_sha256: ['{hash_key("sk-open")}']}}
  thrifty: {{api_key_sha256: ['{hash_key("sk-thrifty")}'], budget: {{daily_usd: "0.0001", on_exceed: downgrade}}}}
"""
KV_STEP = """degradation:
  steps:
  - name: kv-high
    signal: kv_cache_usage
    pool: flagship
    enter_above: 0.85
    exit_below: 0.5
    hold_s: 0
    action: {action}
"""
CLOUD = """  cloud:
    type: remote
    urls: ["{url}"]
    model: cloud-model
    price: {{input_per_mtok: "5.00", output_per_mtok: "20.00"}}
"""


def _unsure(gateway: Gateway, stream: bool, key: str | None = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else None
    return gateway.client.post("/v1/chat/completions", json=_body(-3.0, stream), headers=headers, timeout=10)


def _assert_held(resp: httpx.Response, why: str) -> None:
    assert resp.status_code == 200
    assert (resp.headers["x-cascade-pool"], resp.headers["x-cascade-escalated"]) == ("micro", "false")
    assert (resp.headers["x-cascade-rule"], resp.headers["x-cascade-escalation-held"]) == ("cascade-held", why)
    assert resp.headers["x-cascade-route"] == "score:micro, cascade-held:micro"
    assert "micro-model" in resp.text and "flagship-model" not in resp.text


@pytest.mark.parametrize("stream", [False, True])
def test_micro_only_tenant_keeps_the_unsure_answer(build: Build, fake_upstreams: Upstreams, stream: bool) -> None:
    gateway = build(NARROW)
    resp = _unsure(gateway, stream, "sk-narrow")
    _assert_held(resp, "tenant-pools")
    if stream:
        assert resp.text.count("\"content\":\" w") == 8  # the held-back probe and the rest, in full
    (rec,) = gateway.records(1).values()  # one call, charged once at micro prices, not as a probe
    assert (rec.pool, rec.status, rec.rule, rec.completion_tokens) == ("micro", "ok", "cascade-held", 8)
    assert fake_upstreams[2].requests == 0
    metrics = gateway.client.get("/metrics").text
    assert 'cascade_escalations_total{held_by="tenant-pools",outcome="held",pool="micro"} 1.0' in metrics
    assert _unsure(gateway, stream, "sk-open").headers["x-cascade-escalated"] == "true"  # no limits: it escalates


@pytest.mark.redis
def test_over_budget_tenant_is_not_escalated(build: Build, fake_upstreams: Upstreams, prefix: str) -> None:
    gateway = build(NARROW, ledger="redis", redis_prefix=prefix)
    spend = {"model": "flagship", "messages": [{"role": "user", "content": "hi"}]}  # > 100 micro-USD
    headers = {"authorization": "Bearer sk-thrifty"}
    assert gateway.client.post("/v1/chat/completions", json=spend, headers=headers).status_code == 200
    until(lambda: _unsure(gateway, False, "sk-thrifty").headers.get("x-cascade-escalation-held") == "budget")
    before = fake_upstreams[2].requests
    for stream in (False, True):
        _assert_held(_unsure(gateway, stream, "sk-thrifty"), "budget")
    assert fake_upstreams[2].requests == before


@pytest.mark.parametrize("stream", [False, True])
def test_ladder_moving_the_flagship_to_micro_holds_escalations(build: Build, fake_upstreams: Upstreams,
                                                               stream: bool) -> None:
    gateway = build(KV_STEP.format(action="{type: fallback_pool, to_pool: micro}"))
    fake_upstreams[2].kv_cache_usage = 0.9
    until(lambda: 'cascade_degradation_active{step="kv-high"} 1.0' in gateway.client.get("/metrics").text)
    resp = _unsure(gateway, stream)
    _assert_held(resp, "ladder:kv-high")
    assert resp.headers["x-cascade-degraded"] == "kv-high" and fake_upstreams[2].requests == 0


@pytest.mark.parametrize("stream", [False, True])
def test_escalation_follows_the_ladder_to_an_overflow_pool(build: Build, fake_upstreams: Upstreams,
                                                           stream: bool) -> None:
    step = KV_STEP.format(action="{type: overflow, to_pool: cloud}")
    gateway = build(step, pools=CLOUD.format(url=fake_upstreams[3]))
    fake_upstreams[2].kv_cache_usage = 0.9
    until(lambda: 'cascade_degradation_active{step="kv-high"} 1.0' in gateway.client.get("/metrics").text)
    resp = _unsure(gateway, stream)
    assert resp.status_code == 200 and resp.headers["x-cascade-escalated"] == "true"
    assert (resp.headers["x-cascade-pool"], resp.headers["x-cascade-rule"]) == ("cloud", "cascade")
    assert "cloud-model" in resp.text and "micro-model" not in resp.text
    rid = resp.headers["x-request-id"]
    records = gateway.records(2)
    probe, final = records[rid + "-probe"], records[rid]
    assert (probe.pool, probe.status, final.pool, final.status) == ("micro", "escalated", "cloud", "ok")
    assert final.cost_micro_usd == final.prompt_tokens * 5 + final.completion_tokens * 20  # the cloud's prices
    metrics = gateway.client.get("/metrics").text
    assert 'cascade_escalations_total{held_by="",outcome="escalated",pool="cloud"} 1.0' in metrics


def test_an_answer_the_output_check_sends_again_does_not_re_enter_the_cascade(build: Build,
                                                                             fake_upstreams: Upstreams) -> None:
    """The check chose between retrying and escalating: its retry is one more call on the same pool, not a second
    cascade (no logprobs probe, no second escalation decision)."""
    micro, _, flagship, _ = fake_upstreams
    micro.content = ""  # a confident empty answer: kept by the cascade, failed by the check
    gateway = build("output_checks: {empty: retry}\n")
    resp = gateway.client.post("/v1/chat/completions", json=_body(-0.1, False), timeout=10)
    assert resp.status_code == 200 and resp.headers["x-cascade-output-check-action"] == "retried:empty"
    assert resp.headers["x-cascade-route"] == "score:micro, output-check:micro"
    assert micro.requests == 2 and flagship.requests == 0
    assert micro.last_body is not None and not micro.last_body.get("logprobs")  # the retry was no probe
    assert {r.status for r in gateway.records(2).values()} == {"discarded", "ok"}
