"""The route through a real gateway: a request the score sends to micro that micro's context cannot hold is
answered by the flagship, and `x-cascade-route`, its cost record, the request log and
`cascade_route_steps_total` all name the scoring step with micro, then the context step with the flagship."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import httpx
import orjson
import pytest

from gateway.api.app import create_app
from gateway.ledger.store import MemoryLedger
from gateway.settings import Settings
from tests.conftest import Upstreams, policy_yaml
from tests.servers import free_port, serve

PROMPT = "word " * 60  # 60 words: length score 0.30 < 0.5; ~75 estimated tokens, over micro's 64


def test_a_request_too_long_for_micro_shows_the_score_then_the_context_step(tmp_path: Path,
                                                                           upstreams: Upstreams) -> None:
    _, micro_url, _, flagship_url = upstreams
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml(micro_url, flagship_url).replace("model: micro-model\n",
                                                                   "model: micro-model\n    context_tokens: 64\n"))
    log = tmp_path / "requests.jsonl"
    settings = Settings(policy_path=policy, scorer="length", start_engines=False, ledger="memory", home=tmp_path,
                        request_log=log, policy_watch_interval_s=0)
    app = create_app(settings)
    with serve(app) as url:
        body = {"model": "auto", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 8}
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=30)
        assert r.status_code == 200, r.text
        assert (r.headers["x-cascade-pool"], r.headers["x-cascade-rule"]) == ("flagship", "context-fit")
        assert r.headers["x-cascade-route"] == "score:micro, context-fit:flagship"
        short = httpx.post(url + "/v1/chat/completions", timeout=30,
                           json={"model": "auto", "messages": [{"role": "user", "content": "hi"}]})
        assert short.headers["x-cascade-route"] == "score:micro"  # the context step appends only when it moves
        ledger = app.state.runtime.ledger
        assert isinstance(ledger, MemoryLedger)
        deadline = time.monotonic() + 10
        while len(ledger.records) < 2:
            assert time.monotonic() < deadline, "no cost records"
            time.sleep(0.05)
        metrics = httpx.get(url + "/metrics").text
    rec = ledger.records[r.headers["x-request-id"]]
    assert (rec.pool, rec.rule, rec.route) == ("flagship", "context-fit", "score:micro, context-fit:flagship")
    assert 'cascade_route_steps_total{pool="micro",step="score"} 2.0' in metrics
    assert 'cascade_route_steps_total{pool="flagship",step="context-fit"} 1.0' in metrics
    lines = [orjson.loads(line) for line in log.read_text().splitlines()]
    (line,) = [x for x in lines if x["pool"] == "flagship"]
    assert [(s["step"], s["pool"]) for s in line["route"]] == [("score", "micro"), ("context-fit", "flagship")]
    assert line["route"][0]["why"] == "score 0.300 < 0.5 (threshold)"
    assert "does not fit 'micro' (64 tokens)" in line["route"][1]["why"]
    assert all("word word" not in s["why"] for s in line["route"])  # the route names sizes, never the prompt


def test_an_asleep_on_demand_pool_sends_to_its_cold_fallback_as_a_step(tmp_path: Path,
                                                                       upstreams: Upstreams) -> None:
    from tests.gateway.serving.test_cascade_held_http import ON_DEMAND_FLAGSHIP, _gateway

    _, micro_url, _, flagship_url = upstreams
    pools = ON_DEMAND_FLAGSHIP.format(port=free_port(), timeout=0.5, fallback=', on_cold: "fallback:micro"')
    with _gateway(tmp_path, micro_url, flagship_url, pools, start_engines=True) as gateway:
        r = gateway.client.post("/v1/chat/completions", timeout=30,
                                json={"model": "big", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    assert (r.headers["x-cascade-pool"], r.headers["x-cascade-rule"]) == ("micro", "on-demand-fallback")
    assert r.headers["x-cascade-route"] == "pinned:big, on-demand-fallback:micro"


def test_a_step_that_refuses_names_itself_and_the_log_has_the_route_up_to_it(
        tmp_path: Path, upstreams: Upstreams, caplog: pytest.LogCaptureFixture) -> None:
    _, micro_url, _, flagship_url = upstreams
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml(micro_url, flagship_url).replace("model: micro-model\n",
                                                                   "model: micro-model\n    context_tokens: 64\n"))
    settings = Settings(policy_path=policy, scorer="length", start_engines=False, ledger="memory", home=tmp_path,
                        policy_watch_interval_s=0)
    with caplog.at_level(logging.INFO, logger="cascade.gateway"), serve(create_app(settings)) as url:
        body = {"model": "micro", "messages": [{"role": "user", "content": PROMPT}]}  # pinned: never moved
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert r.json()["error"]["message"].startswith("context-fit: a prompt of ")
    (line,) = [m.getMessage() for m in caplog.records if "route step" in m.getMessage()]
    assert "route step context-fit refused it" in line and line.endswith("after route pinned:micro")
    assert "word word" not in line
