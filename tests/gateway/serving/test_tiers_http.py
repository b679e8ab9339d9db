"""A three-pool policy served through a gateway in-process (`tests.harness`) over three fake upstreams, called with
the official openai SDK: each request goes to the tier with the best trade of predicted quality against expected
cost, `x-cascade-route` names the trade, `x-cascade-tiers` and the cost record carry every tier's estimate, a
request too long for its tier moves up the tiers, and a placement that cannot be loaded at reload leaves the
previous policy serving. The pool map's side is faked (`tier_fakes`); the gateway's is real."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis

from gateway.api.app import create_app
from gateway.control.adaptation.live_tradeoff import entry_of, trades_key
from gateway.ledger.record import CostRecord
from gateway.ledger.store import MemoryLedger
from gateway.settings import Settings
from loadtest.fake_upstream import FakeUpstream
from policies.loader import load_policy
from policies.replay import parse_log, replay
from policies.tiers import TierEstimate
from tests.conftest import SHARED_URL, GatewayFactory
from tests.gateway.serving.tier_fakes import fake_the_map
from tests.harness import FakeEngines, Gateway
from tests.servers import serve, until

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
def gateway(make_gateway: GatewayFactory, fake_engines: FakeEngines, tmp_path: Path,
            monkeypatch: pytest.MonkeyPatch) -> tuple[Gateway, Path, MemoryLedger]:
    fake_the_map(monkeypatch)
    (tmp_path / "code.json").write_text(json.dumps({"base": 0.70, "code": 0.15, "hard": -0.50}))
    urls = {name: fake_engines.add(name, FakeUpstream(f"{name}-model")) for name in ("general", "code", "flagship")}
    policy = tmp_path / "three.yaml"
    policy.write_text(_policy(urls))
    served = make_gateway(policy, admin_key=ADMIN, policy_watch_interval_s=0, request_log=tmp_path / "requests.jsonl")
    return served, policy, served.ledger


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


def test_each_request_goes_to_the_best_trade_and_says_so(gateway: tuple[Gateway, Path, MemoryLedger]) -> None:
    served, policy, ledger = gateway
    client = served.openai("unused", max_retries=0)
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
    # the replay log carries each request's tier predictions: replayed under the same policy, nothing moves
    log = policy.parent / "requests.jsonl"
    until(lambda: log.exists() and len(log.read_text().splitlines()) >= 3, 10, lambda: "no replay log lines")
    result = replay(parse_log(log.read_text().splitlines()), load_policy(policy))
    assert (result.total, result.moved, result.traded) == (3, 0, 3)


def test_a_request_too_long_for_its_tier_moves_up_the_tiers(gateway: tuple[Gateway, Path, MemoryLedger]) -> None:
    served, _, _ = gateway
    client = served.openai("unused", max_retries=0)
    headers, model = _ask(client, "word " * 60)  # ~75 estimated tokens: over general's 64
    assert (headers["x-cascade-pool"], model) == ("code", "code-model")
    assert headers["x-cascade-route"] == "trade:general, context-fit:code"


def test_a_placement_that_cannot_load_at_reload_keeps_the_previous_policy(
        gateway: tuple[Gateway, Path, MemoryLedger]) -> None:
    served, policy, _ = gateway
    before = served.client.post("/v1/chat/completions", timeout=30, json={
        "model": "auto", "messages": [{"role": "user", "content": "a python question"}]})
    text = policy.read_text()
    policy.write_text(text.replace("placement: code.json", "placement: missing.json").replace("tradeoff: 50",
                                                                                           "tradeoff: 0"))
    r = served.client.post("/admin/policy/reload", headers={"authorization": f"Bearer {ADMIN}"}, timeout=30)
    assert r.status_code == 422, r.text
    (problem,) = r.json()["error"]["problems"]
    assert problem.startswith(f"{policy}:") and "pools.code.placement: cannot load placement 'missing.json'" in problem
    assert "cascade router place" in problem
    after = served.client.post("/v1/chat/completions", timeout=30, json={
        "model": "auto", "messages": [{"role": "user", "content": "a python question"}]})
    assert after.headers["x-cascade-policy-version"] == before.headers["x-cascade-policy-version"]
    assert after.headers["x-cascade-tiers"] == before.headers["x-cascade-tiers"]
    assert after.headers["x-cascade-pool"] == "code"  # tradeoff 50 still: tradeoff 0 would pick the flagship
    policy.write_text(text.replace("tradeoff: 50", "tradeoff: 0"))
    assert served.client.post("/admin/policy/reload", headers={"authorization": f"Bearer {ADMIN}"}).status_code == 200
    fixed = served.client.post("/v1/chat/completions", timeout=30, json={
        "model": "auto", "messages": [{"role": "user", "content": "a python question"}]})
    assert fixed.headers["x-cascade-pool"] == "flagship"


EXAMPLE = Path(__file__).resolve().parents[3] / "policies" / "examples" / "three-pools.yaml"


def test_the_three_pool_example_passes_the_schema_and_is_served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    import jsonschema
    import yaml

    from gateway.serving.routing import placements
    from policies.loader import load_policy
    from tests.gateway.serving.tier_fakes import NAMED
    from tests.policies.test_examples import _exported_schema

    policy = load_policy(EXAMPLE).policy
    assert policy.routing.tiers == ("general", "code", "flagship")
    assert (policy.routing.micro_pool, policy.routing.flagship_pool) == ("general", "flagship")
    validator = jsonschema.Draft202012Validator(_exported_schema(capsys))
    assert [e.message for e in validator.iter_errors(yaml.safe_load(EXAMPLE.read_text()))] == []
    fake_the_map(monkeypatch)
    stand_in = dict(zip((policy.pools[p].placement for p in policy.routing.tiers), NAMED.values(), strict=True))
    monkeypatch.setattr(placements, "MapPlacements", lambda: _Named(stand_in))
    settings = Settings(policy_path=EXAMPLE, scorer="length", start_engines=False, ledger="memory", home=tmp_path,
                        policy_watch_interval_s=0)
    with serve(create_app(settings)) as url:
        models = httpx.get(url + "/v1/models", timeout=30)
    assert {m["id"] for m in models.json()["data"]} >= {"general", "code", "flagship", "auto"}


class _Named:
    """The example's shared-source model names, placed as the fake map's stand-ins."""

    def __init__(self, names: Mapping[str | None, object]) -> None:
        self._names = names

    def load(self, path: Path) -> object:
        raise AssertionError(f"the example names no placement file ({path})")

    def named(self, name: str) -> object:
        return self._names[name]


def test_the_shipped_classifier_and_pool_map_pick_the_best_predicted_quality(tmp_path: Path) -> None:
    """No fake: the trained classifier keeps each request's feature row, the shipped pool map predicts from it, and
    the tiers are placed as shared sources' models by name. At tradeoff 0 each request goes to the tier the
    header shows the highest predicted quality for."""
    upstreams = {name: FakeUpstream(f"{name}-model") for name in ("general", "code", "flagship")}
    with serve(upstreams["general"]) as g, serve(upstreams["code"]) as c, serve(upstreams["flagship"]) as f:
        policy = tmp_path / "three.yaml"
        policy.write_text(_policy({"general": g, "code": c, "flagship": f}, "routerbench/meta/code-llama-instruct-34b-"
                                  "chat").replace("general-7b", "routerbench/mistralai/mistral-7b-chat").replace(
            "placement: frontier", "placement: routerbench/gpt-4-1106-preview").replace("tradeoff: 50", "tradeoff: 0"))
        settings = Settings(policy_path=policy, scorer="classifier", start_engines=False, ledger="memory",
                            home=tmp_path, policy_watch_interval_s=0)
        with serve(create_app(settings)) as url:
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
            for text in ("hi, how are you today?", "Write a Python function that merges two sorted lists.",
                         "Prove that there are infinitely many primes."):
                headers, _ = _ask(client, text)
                predicted = {e.split("=")[0]: float(e.split("=")[1].split("/")[0])
                             for e in headers["x-cascade-tiers"].split(", ")}
                assert list(predicted) == ["general", "code", "flagship"] and all(0 < q < 1 for q in predicted.values())
                chosen = headers["x-cascade-route"].removeprefix("trade:")
                assert predicted[chosen] >= max(predicted.values()) - 0.001  # the header rounds to 3 decimals


@pytest.mark.redis
def test_a_reload_switches_the_version_and_the_tradeoff_together(make_gateway: GatewayFactory,
                                                                  fake_engines: FakeEngines, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch, prefix: str) -> None:
    fake_the_map(monkeypatch)
    (tmp_path / "code.json").write_text(json.dumps({"base": 0.70, "code": 0.15, "hard": -0.50}))
    urls = {name: fake_engines.add(name, FakeUpstream(f"{name}-model")) for name in ("general", "code", "flagship")}
    policy = tmp_path / "three.yaml"
    text = _policy(urls).replace("tradeoff: 50", "cost_per_1k: '2.00'")
    policy.write_text(text)
    cheap = (TierEstimate("general", 0.5, 0.00001), TierEstimate("code", 0.6, 0.0001),
             TierEstimate("flagship", 0.9, 0.0015))  # the flagship everywhere: $1.50 per 1k
    client = redis.Redis.from_url(SHARED_URL)
    client.lpush(trades_key(prefix), *[entry_of(cheap)] * 200)
    client.close()
    served = make_gateway(policy, admin_key=ADMIN, policy_watch_interval_s=0, ledger="redis", redis_prefix=prefix)

    def tradeoff() -> dict[str, Any]:
        found: dict[str, Any] = served.client.get("/readyz").json()["routing"]["tradeoff"]
        return found

    until(lambda: tradeoff()["source"] == "window-held")
    assert tradeoff()["value"] == 0  # $1.50 is within $2: the best predicted quality
    ask = {"model": "auto", "messages": [{"role": "user", "content": "a python question"}]}
    assert served.client.post("/v1/chat/completions", json=ask, timeout=30).headers["x-cascade-pool"] == "flagship"
    policy.write_text(text.replace("cost_per_1k: '2.00'", "cost_per_1k: '1.00'"))
    reloaded = served.client.post("/admin/policy/reload", headers={"authorization": f"Bearer {ADMIN}"})
    assert reloaded.status_code == 200
    first = served.client.post("/v1/chat/completions", json=ask, timeout=30)  # at once: no refresh since
    assert first.headers["x-cascade-policy-version"] == reloaded.json()["policy_version"]
    assert first.headers["x-cascade-pool"] != "flagship", first.headers  # $1.50 is over $1: traded down
    now = tradeoff()
    assert now["source"] == "window-held" and now["value"] > 100 and now["cost_per_1k_usd"] == 1.0
