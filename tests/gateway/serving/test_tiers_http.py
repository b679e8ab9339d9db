"""A three-pool policy served end to end through a real gateway (uvicorn) over three fake upstreams, called with
the official openai SDK: each request goes to the tier with the best trade of predicted quality against expected
cost, `x-cascade-route` names the trade, `x-cascade-tiers` and the cost record carry every tier's estimate, a
request too long for its tier moves up the tiers, and a placement that cannot be loaded at reload leaves the
previous policy serving. The pool map's side is faked (`tier_fakes`); the gateway's is real."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from gateway.api.app import create_app
from gateway.ledger.record import CostRecord
from gateway.ledger.store import MemoryLedger
from gateway.settings import Settings
from loadtest.fake_upstream import FakeUpstream
from tests.gateway.serving.tier_fakes import fake_the_map
from tests.servers import serve

ADMIN = "test-admin-key"


def _policy(urls: dict[str, str], code_placement: str = "code.json") -> str:
    return f"""
version: 1
pools:
  general:
    type: remote
    urls: ["{urls['general']}"]
    model: general-model
    context_tokens: 64
    placement: general-7b
    price: {{input_per_mtok: "0.20", output_per_mtok: "0.20"}}
  code:
    type: remote
    urls: ["{urls['code']}"]
    model: code-model
    placement: {code_placement}
    expected_completion_tokens: 400
    price: {{input_per_mtok: "0.80", output_per_mtok: "0.80"}}
  flagship:
    type: remote
    urls: ["{urls['flagship']}"]
    model: flagship-model
    placement: frontier
    price: {{input_per_mtok: "10.00", output_per_mtok: "30.00"}}
routing:
  tiers: [general, code, flagship]
  tradeoff: 50
"""


@pytest.fixture
def gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path, MemoryLedger]]:
    fake_the_map(monkeypatch)
    (tmp_path / "code.json").write_text(json.dumps({"base": 0.70, "code": 0.15, "hard": -0.50}))
    upstreams = {name: FakeUpstream(f"{name}-model") for name in ("general", "code", "flagship")}
    with serve(upstreams["general"]) as g, serve(upstreams["code"]) as c, serve(upstreams["flagship"]) as f:
        policy = tmp_path / "three.yaml"
        policy.write_text(_policy({"general": g, "code": c, "flagship": f}))
        settings = Settings(policy_path=policy, scorer="length", start_engines=False, ledger="memory",
                            home=tmp_path, admin_key=ADMIN, policy_watch_interval_s=0)
        app = create_app(settings)
        with serve(app) as url:
            ledger = app.state.runtime.ledger
            assert isinstance(ledger, MemoryLedger)
            yield url, policy, ledger


def _ask(client: openai.OpenAI, text: str) -> tuple[dict[str, str], str]:
    raw = client.chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": text}], max_tokens=8)
    completion = raw.parse()
    return dict(raw.headers), completion.model


def _record(ledger: MemoryLedger, request_id: str) -> CostRecord:
    deadline = time.monotonic() + 10
    while request_id not in ledger.records:
        assert time.monotonic() < deadline, "no cost record"
        time.sleep(0.02)
    return ledger.records[request_id]


def test_each_request_goes_to_the_best_trade_and_says_so(gateway: tuple[str, Path, MemoryLedger]) -> None:
    url, _, ledger = gateway
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    seen = {}
    for text in ("hi, how are you today?", "write a python function that sorts a list",
                 "prove that the square root of two is irrational"):
        headers, model = _ask(client, text)
        seen[headers["x-cascade-pool"]] = (headers, model)
    assert set(seen) == {"general", "code", "flagship"}  # each tier took the request it trades best on
    headers, model = seen["code"]
    assert (model, headers["x-cascade-rule"], headers["x-cascade-route"]) == ("code-model", "trade", "trade:code")
    tiers = headers["x-cascade-tiers"].split(", ")
    assert [t.split("=")[0] for t in tiers] == ["general", "code", "flagship"]
    assert tiers[1].startswith("code=0.850/$0.000")  # its predicted quality and expected cost
    rec = _record(ledger, headers["x-request-id"])
    assert (rec.tiers, rec.route) == (headers["x-cascade-tiers"], "trade:code")


def test_a_request_too_long_for_its_tier_moves_up_the_tiers(gateway: tuple[str, Path, MemoryLedger]) -> None:
    url, _, _ = gateway
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    headers, model = _ask(client, "word " * 60)  # ~75 estimated tokens: over general's 64
    assert (headers["x-cascade-pool"], model) == ("code", "code-model")
    assert headers["x-cascade-route"] == "trade:general, context-fit:code"


def test_a_placement_that_cannot_load_at_reload_keeps_the_previous_policy(
        gateway: tuple[str, Path, MemoryLedger]) -> None:
    url, policy, _ = gateway
    before = httpx.post(url + "/v1/chat/completions", timeout=30, json={
        "model": "auto", "messages": [{"role": "user", "content": "a python question"}]})
    text = policy.read_text()
    policy.write_text(text.replace("placement: code.json", "placement: missing.json").replace("tradeoff: 50",
                                                                                           "tradeoff: 0"))
    r = httpx.post(url + "/admin/policy/reload", headers={"authorization": f"Bearer {ADMIN}"}, timeout=30)
    assert r.status_code == 422, r.text
    (problem,) = r.json()["error"]["problems"]
    assert problem.startswith(f"{policy}:") and "pools.code.placement: cannot load placement 'missing.json'" in problem
    assert "cascade router place" in problem
    after = httpx.post(url + "/v1/chat/completions", timeout=30, json={
        "model": "auto", "messages": [{"role": "user", "content": "a python question"}]})
    assert after.headers["x-cascade-policy-version"] == before.headers["x-cascade-policy-version"]
    assert after.headers["x-cascade-tiers"] == before.headers["x-cascade-tiers"]
    assert after.headers["x-cascade-pool"] == "code"  # tradeoff 50 still: tradeoff 0 would pick the flagship
    policy.write_text(text.replace("tradeoff: 50", "tradeoff: 0"))
    assert httpx.post(url + "/admin/policy/reload", headers={"authorization": f"Bearer {ADMIN}"}).status_code == 200
    fixed = httpx.post(url + "/v1/chat/completions", timeout=30, json={
        "model": "auto", "messages": [{"role": "user", "content": "a python question"}]})
    assert fixed.headers["x-cascade-pool"] == "flagship"
