"""Output checks on the response path, over HTTP: a real Starlette gateway in front of two fake engines whose
answers the test chooses. A JSON answer that fails its check is escalated, retried or flagged as the policy says,
with every call in the ledger exactly once; a stream is judged and flagged, never replaced."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.api.app import create_app
from gateway.ledger.store import MemoryLedger
from gateway.settings import Settings
from tests.conftest import Upstreams, policy_yaml
from tests.harness import wait_records
from tests.servers import free_port, serve

JSON_OBJECT = {"response_format": {"type": "json_object"}}


def _gateway(tmp_path: Path, micro_url: str, flagship_url: str, checks: str) -> Iterator[tuple[str, MemoryLedger]]:
    path = tmp_path / "policy.yaml"
    tenants = """tenants:
  relaxed:
    api_key_sha256: ["9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"]
    output_checks: {json: off}
  team:
    api_key_sha256: ["d9298a10d1b0735837dc4bd85dac641b0f3cef27a47e5d53a54f2f3f5b2fcffa"]
"""  # keys "test" and "other"
    path.write_text(policy_yaml(micro_url, flagship_url, f"output_checks: {checks}\n{tenants}"))
    app = create_app(Settings(policy_path=path, scorer="length", start_engines=False, ledger="memory", home=tmp_path))
    with serve(app) as url:
        yield url, app.state.runtime.ledger


@pytest.fixture
def escalating(tmp_path: Path, upstreams: Upstreams) -> Iterator[tuple[str, MemoryLedger]]:
    _, micro_url, _, flagship_url = upstreams
    yield from _gateway(tmp_path, micro_url, flagship_url, "{json: escalate, empty: retry}")


def _ask(url: str, stream: bool = False, key: str = "other", **body: Any) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"}
    return httpx.post(url + "/v1/chat/completions", headers=headers, timeout=10, json={
        "model": "auto", "messages": [{"role": "user", "content": "name a colour as JSON"}], "stream": stream,
        **JSON_OBJECT, **body})


def _metric(url: str, line: str) -> bool:
    return line in httpx.get(url + "/metrics").text


def test_a_micro_answer_that_is_not_json_is_escalated_and_both_calls_are_recorded(
        escalating: tuple[str, MemoryLedger], upstreams: Upstreams) -> None:
    url, ledger = escalating
    micro, _, flagship, _ = upstreams
    micro.content, flagship.content = "Blue, I think.", '{"colour": "blue"}'
    resp = _ask(url)
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["content"] == '{"colour": "blue"}'
    h = resp.headers
    assert (h["x-cascade-pool"], h["x-cascade-rule"]) == ("flagship", "output-check")
    assert h["x-cascade-output-check"] == "json=pass, empty=pass"
    assert h["x-cascade-output-check-action"] == "escalated:json"
    assert h["x-cascade-route"] == "score:micro, output-check:flagship"
    rid = h["x-request-id"]
    records = wait_records(ledger, 2)
    dropped, served = records[rid + "-check"], records[rid]
    assert (dropped.pool, dropped.status, dropped.output_check) == ("micro", "discarded", "fail:json")
    assert dropped.cost_micro_usd > 0 and dropped.flagship_cost_micro_usd == 0  # paid for, not a saving
    assert (served.pool, served.status, served.output_check) == ("flagship", "ok", "pass")
    assert _metric(url, 'cascade_output_checks_total{check="json",model="micro-model",pool="micro",result="fail"} 1.0')
    assert _metric(url, 'cascade_output_checks_total{check="json",model="flagship-model",pool="flagship",'
                        'result="pass"} 1.0')
    assert _metric(url, 'cascade_output_check_actions_total{action="escalated",check="json",pool="micro"} 1.0')


def test_a_passing_answer_is_served_as_it_is(escalating: tuple[str, MemoryLedger], upstreams: Upstreams) -> None:
    url, ledger = escalating
    upstreams[0].content = '{"colour": "red"}'
    resp = _ask(url)
    assert (resp.headers["x-cascade-pool"], resp.headers["x-cascade-output-check"]) == ("micro",
                                                                                       "json=pass, empty=pass")
    assert "x-cascade-output-check-action" not in resp.headers
    (rec,) = wait_records(ledger, 1).values()
    assert (rec.status, rec.output_check) == ("ok", "pass")


def test_a_tenant_that_turns_the_check_off_gets_the_answer(escalating: tuple[str, MemoryLedger],
                                                           upstreams: Upstreams) -> None:
    url, _ledger = escalating
    upstreams[0].content = "Blue."
    resp = _ask(url, key="test")
    assert resp.headers["x-cascade-pool"] == "micro" and resp.headers["x-cascade-output-check"] == "empty=pass"
    assert upstreams[2].requests == 0


def test_an_empty_answer_is_retried_once_on_the_same_pool(escalating: tuple[str, MemoryLedger],
                                                          upstreams: Upstreams) -> None:
    url, ledger = escalating
    micro = upstreams[0]
    micro.content = ""
    resp = _ask(url, response_format=None)
    assert micro.requests == 2 and upstreams[2].requests == 0
    assert resp.headers["x-cascade-pool"] == "micro"
    assert resp.headers["x-cascade-output-check"] == "empty=fail"  # still empty: served, flagged, not retried again
    assert resp.headers["x-cascade-output-check-action"] == "retried:empty"
    assert resp.headers["x-cascade-route"].endswith(":micro, output-check:micro")  # the same pool, asked again
    records = wait_records(ledger, 2)
    assert {r.status for r in records.values()} == {"discarded", "ok"}


def test_a_stream_is_judged_and_flagged_never_replaced(escalating: tuple[str, MemoryLedger],
                                                       upstreams: Upstreams) -> None:
    url, ledger = escalating
    upstreams[0].content = "Blue, definitely blue."
    resp = _ask(url, stream=True)
    chunks = [json.loads(line[6:]) for line in resp.text.splitlines() if line.startswith("data: {")]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert resp.status_code == 200 and text == "Blue, definitely blue."
    assert resp.headers["x-cascade-pool"] == "micro" and upstreams[2].requests == 0
    (rec,) = wait_records(ledger, 1).values()
    assert (rec.status, rec.output_check) == ("ok", "fail:json")
    assert _metric(url, 'cascade_output_check_actions_total{action="flagged",check="json",pool="micro"} 1.0')


def test_a_pinned_model_is_not_escalated(escalating: tuple[str, MemoryLedger], upstreams: Upstreams) -> None:
    url, _ = escalating
    upstreams[0].content = "Blue."
    resp = _ask(url, model="micro")
    assert resp.headers["x-cascade-pool"] == "micro" and upstreams[2].requests == 0
    assert resp.headers["x-cascade-output-check"] == "json=fail, empty=pass"
    assert _metric(url, 'cascade_output_check_actions_total{action="held",check="json",pool="micro"} 1.0')


def test_flag_only_keeps_the_answer(tmp_path: Path, upstreams: Upstreams) -> None:
    micro, micro_url, _, flagship_url = upstreams
    micro.content = '{"colour": 7}'
    schema = {"type": "json_schema", "json_schema": {"name": "c", "schema": {
        "type": "object", "properties": {"colour": {"type": "string"}}, "required": ["colour"]}}}
    for url, ledger in _gateway(tmp_path, micro_url, flagship_url, "{json: flag}"):
        resp = _ask(url, response_format=schema)
        assert resp.headers["x-cascade-output-check"] == "json=fail"
        assert resp.json()["choices"][0]["message"]["content"] == '{"colour": 7}'
        (rec,) = wait_records(ledger, 1).values()
        assert rec.output_check == "fail:json"


def test_escalation_without_a_flagship_serves_the_first_answer_flagged(tmp_path: Path, upstreams: Upstreams) -> None:
    micro, micro_url, _, _ = upstreams
    micro.content = "Blue."
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens
    for url, ledger in _gateway(tmp_path, micro_url, dead, "{json: escalate}"):
        resp = _ask(url)
        assert resp.status_code == 200 and resp.json()["choices"][0]["message"]["content"] == "Blue."
        assert resp.headers["x-cascade-output-check-action"] == "held:json"
        (rec,) = wait_records(ledger, 1).values()  # the micro answer, recorded once (as the discarded try)
        assert (rec.pool, rec.status) == ("micro", "discarded")


def test_an_invalid_json_schema_is_a_400_before_any_engine(escalating: tuple[str, MemoryLedger],
                                                          upstreams: Upstreams) -> None:
    url, _ = escalating
    bad = {"type": "json_schema", "json_schema": {"name": "c", "schema": {"type": 12}}}
    resp = _ask(url, response_format=bad)
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert (error["param"], error["code"]) == ("response_format.json_schema.schema", "invalid_json_schema")
    assert upstreams[0].requests == 0 and upstreams[2].requests == 0
