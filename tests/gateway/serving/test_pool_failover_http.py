"""Pool failover over HTTP: when every replica of the routed pool answers 5xx (after the proxy's retries), or none
can take the request, the request goes to the other tier the tenant and budget allow, before any byte reached the
client, with `failover` on its route. A real Starlette gateway in front of two fake engines; the micro one is told
to answer every chat request with an error status (`FakeUpstream.fail_status`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from gateway.api.app import create_app
from gateway.api.auth import hash_key
from gateway.ledger.store import MemoryLedger
from gateway.settings import Settings
from tests.conftest import Upstreams, policy_yaml
from tests.harness import wait_records
from tests.servers import serve

EASY = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}
TENANTS = f"""tenants:
  open: {{api_key_sha256: ['{hash_key("sk-open")}']}}
  micro-only: {{api_key_sha256: ['{hash_key("sk-micro")}'], allowed_pools: [micro]}}
"""


@contextmanager
def _gateway(tmp_path: Path, upstreams: Upstreams, routing: str = "", extra: str = "",
             ) -> Iterator[tuple[str, MemoryLedger]]:
    _, micro_url, _, flagship_url = upstreams
    path = tmp_path / "policy.yaml"
    path.write_text(policy_yaml(micro_url, flagship_url, routing) + extra)
    app = create_app(Settings(policy_path=path, scorer="length", start_engines=False, ledger="memory", home=tmp_path))
    with serve(app) as url:
        yield url, app.state.runtime.ledger


def _post(url: str, stream: bool = False, key: str | None = None, model: str = "auto") -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else None
    return httpx.post(url + "/v1/chat/completions", json={**EASY, "model": model, "stream": stream}, headers=headers,
                      timeout=10)


@pytest.mark.parametrize("stream", [False, True])
def test_a_pool_whose_every_replica_answers_5xx_fails_over_to_the_other_tier(tmp_path: Path, upstreams: Upstreams,
                                                                            stream: bool) -> None:
    """On by default. The first requests meet the engine's 500s (the proxy's last error, a 502), the later ones
    its open breaker (no replica): each is answered by the flagship."""
    micro, _, flagship, _ = upstreams
    micro.fail_status = 500
    with _gateway(tmp_path, upstreams) as (url, ledger):
        replies = [_post(url, stream) for _ in range(10)]
        assert [r.status_code for r in replies] == [200] * 10, replies[0].text
        for r in replies:
            assert (r.headers["x-cascade-pool"], r.headers["x-cascade-rule"]) == ("flagship", "failover")
            assert r.headers["x-cascade-route"] == "score:micro, failover:flagship"
            assert "flagship-model" in r.text
        records = wait_records(ledger, 10)
    assert {(rec.pool, rec.status, rec.route) for rec in records.values()} == {
        ("flagship", "ok", "score:micro, failover:flagship")}
    assert micro.requests >= 1 and flagship.requests == 10


def test_with_failover_off_the_engine_error_is_passed_on(tmp_path: Path, upstreams: Upstreams) -> None:
    micro, _, flagship, _ = upstreams
    micro.fail_status = 500
    with _gateway(tmp_path, upstreams, "  failover: false") as (url, _ledger):
        resp = _post(url)
    assert resp.status_code == 502 and resp.json()["error"]["code"] == "upstream_rejected"
    assert flagship.requests == 0


def test_a_4xx_is_the_requests_fault_and_is_not_failed_over(tmp_path: Path, upstreams: Upstreams) -> None:
    micro, _, flagship, _ = upstreams
    micro.fail_status = 400
    with _gateway(tmp_path, upstreams) as (url, _ledger):
        resp = _post(url)
    assert resp.status_code == 400 and flagship.requests == 0


def test_failover_stays_within_the_tenant_and_never_swaps_a_pinned_model(tmp_path: Path,
                                                                         upstreams: Upstreams) -> None:
    micro, _, flagship, _ = upstreams
    micro.fail_status = 503
    with _gateway(tmp_path, upstreams, extra=TENANTS) as (url, _ledger):
        assert _post(url, key="sk-micro").status_code == 502  # the flagship is not its to use
        assert _post(url, key="sk-open", model="micro").status_code == 502  # its caller asked for that model
        assert flagship.requests == 0
        moved = _post(url, key="sk-open")
        assert moved.status_code == 200 and moved.headers["x-cascade-route"] == "score:micro, failover:flagship"
