"""A second engine call for one request (a cascade escalation, an output-check escalation) is held against the
tenant's budget before it is made: a budget the first call's hold already fills keeps the first answer. Real gateway,
real Redis ledger, fake engines whose answers the test chooses."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from gateway.api.app import create_app
from gateway.api.auth import hash_key
from gateway.ledger.keys import LedgerKeys
from gateway.settings import Settings
from loadtest.scenarios.chaos_figures import ledger_records
from tests.conftest import SHARED_URL, Upstreams, delete_prefix, policy_yaml
from tests.gateway.serving.test_cascade import CASCADE, _body
from tests.servers import serve, until

pytestmark = pytest.mark.redis
TENANTS = f"""tenants:
  broke: {{api_key_sha256: ['{hash_key("sk-broke")}'], budget: {{daily_usd: "0.000001"}}}}
  rich: {{api_key_sha256: ['{hash_key("sk-rich")}'], budget: {{daily_usd: "100"}}}}
"""


def _gateway(tmp_path: Path, upstreams: Upstreams, extra: str) -> Iterator[tuple[str, str]]:
    _, micro_url, _, flagship_url = upstreams
    path = tmp_path / "policy.yaml"
    path.write_text(policy_yaml(micro_url, flagship_url, extra) + TENANTS)
    prefix = f"test:{uuid.uuid4().hex[:8]}:"
    app = create_app(Settings(policy_path=path, scorer="length", start_engines=False, ledger="redis",
                              redis_prefix=prefix, home=tmp_path, probe_interval_s=0.1))
    with serve(app) as url:
        yield url, prefix
    delete_prefix(prefix)


@pytest.fixture
def cascading(tmp_path: Path, upstreams: Upstreams) -> Iterator[tuple[str, str]]:
    yield from _gateway(tmp_path, upstreams, CASCADE)


@pytest.fixture
def checking(tmp_path: Path, upstreams: Upstreams) -> Iterator[tuple[str, str]]:
    yield from _gateway(tmp_path, upstreams, "output_checks: {json: escalate}\n")


def _holds(prefix: str, tenant: str) -> dict[str, str]:
    client = redis.Redis.from_url(SHARED_URL, decode_responses=True)
    try:
        return client.hgetall(LedgerKeys(prefix).holds(tenant))  # type: ignore[return-value]
    finally:
        client.close()


@pytest.mark.parametrize("stream", [False, True])
def test_an_escalation_the_budget_cannot_hold_keeps_the_micro_answer(
        cascading: tuple[str, str], upstreams: Upstreams, stream: bool) -> None:
    url, prefix = cascading
    micro, _, flagship, _ = upstreams
    resp = httpx.post(url + "/v1/chat/completions", json=_body(-3.0, stream), timeout=10,
                      headers={"authorization": "Bearer sk-broke"})  # admitted: nothing spent, nothing held yet
    assert resp.status_code == 200, resp.text
    assert (resp.headers["x-cascade-pool"], resp.headers["x-cascade-escalation-held"]) == ("micro", "budget")
    assert flagship.requests == 0 and micro.requests == 1
    until(lambda: len(ledger_records(SHARED_URL, prefix)) == 1)
    until(lambda: set(_holds(prefix, "broke")) <= {" sum"})  # its record released the hold
    rich = httpx.post(url + "/v1/chat/completions", json=_body(-3.0, stream), timeout=10,
                      headers={"authorization": "Bearer sk-rich"})
    assert rich.headers["x-cascade-pool"] == "flagship" and flagship.requests == 1  # a budget that holds it: escalated


def test_an_output_check_escalation_the_budget_cannot_hold_serves_the_first_answer(
        checking: tuple[str, str], upstreams: Upstreams) -> None:
    url, prefix = checking
    micro, _, flagship, _ = upstreams
    micro.content, flagship.content = "Blue, I think.", '{"colour": "blue"}'
    body = {"model": "auto", "messages": [{"role": "user", "content": "name a colour as JSON"}],
            "response_format": {"type": "json_object"}}
    resp = httpx.post(url + "/v1/chat/completions", json=body, timeout=10, headers={"authorization": "Bearer sk-broke"})
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-cascade-output-check-action"] == "held:json" and flagship.requests == 0
    assert resp.json()["choices"][0]["message"]["content"] == "Blue, I think."
    until(lambda: len(ledger_records(SHARED_URL, prefix)) == 1)  # the discarded answer, the only call made
    until(lambda: set(_holds(prefix, "broke")) <= {" sum"})  # the request's hold given back, not left to expire
    rich = httpx.post(url + "/v1/chat/completions", json=body, timeout=10, headers={"authorization": "Bearer sk-rich"})
    assert rich.headers["x-cascade-output-check-action"] == "escalated:json" and flagship.requests == 1
