"""Rate limits and budgets through the gateway in-process (`tests.harness`), with the real Redis ledger and limiter."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import redis

from gateway.api.auth import hash_key
from gateway.ledger.keys import LedgerKeys
from gateway.settings import Settings
from loadtest.scenarios.chaos_figures import ledger_records
from tests.conftest import SHARED_URL, GatewayFactory, Upstreams, delete_prefix, policy_yaml
from tests.harness import FakeEngines, Gateway, InProcessGateway
from tests.servers import until

pytestmark = pytest.mark.redis
TENANTS = f"""tenants:
  capped: {{api_key_sha256: ['{hash_key("sk-capped")}'], rate_limits: {{requests_per_minute: 3}}}}
  broke: {{api_key_sha256: ['{hash_key("sk-broke")}'], budget: {{daily_usd: "0.0001"}}}}
  thrifty: {{api_key_sha256: ['{hash_key("sk-thrifty")}'], budget: {{daily_usd: "0.0001", on_exceed: downgrade}}}}
  tight: {{api_key_sha256: ['{hash_key("sk-tight")}'], budget: {{daily_usd: "0.002"}}, on_redis_outage: fail_closed}}
  small: {{api_key_sha256: ['{hash_key("sk-small")}'], rate_limits: {{requests_per_minute: 2}}}}
"""


@contextmanager
def redis_gateway(tmp_path: Path, policy: str, engines: FakeEngines) -> Iterator[tuple[Gateway, str]]:
    """A gateway in-process serving `policy` over `engines` on the shared Redis ledger under a fresh prefix:
    (gateway, prefix); the prefix's keys are deleted after."""
    path = tmp_path / "policy.yaml"
    path.write_text(policy)
    prefix = f"test:{uuid.uuid4().hex[:8]}:"
    settings = Settings(policy_path=path, scorer="none", start_engines=False, ledger="redis", redis_prefix=prefix,
                        home=tmp_path)
    with InProcessGateway(settings, engines) as gateway:
        yield gateway, prefix
    delete_prefix(prefix)


@pytest.fixture
def gateway_prefix(tmp_path: Path, fake_engines: FakeEngines,
                   fake_upstreams: Upstreams) -> Iterator[tuple[Gateway, str]]:
    _, micro_url, _, flagship_url = fake_upstreams
    with redis_gateway(tmp_path, policy_yaml(micro_url, flagship_url) + TENANTS, fake_engines) as served:
        yield served


@pytest.fixture
def gateway(gateway_prefix: tuple[Gateway, str]) -> Gateway:
    return gateway_prefix[0]


def _post(gateway: Gateway, key: str, model: str = "flagship", max_tokens: int = 8) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": max_tokens,
            "metadata": {"fake_tokens": str(max_tokens)}}  # the fake upstream answers max_tokens tokens
    return gateway.client.post("/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"},
                               timeout=120)


def test_requests_per_minute(gateway: Gateway, caplog: pytest.LogCaptureFixture) -> None:
    assert [_post(gateway, "sk-capped").status_code for _ in range(3)] == [200, 200, 200]
    r = _post(gateway, "sk-capped")
    for _ in range(3):  # a Redis call over the limiter's 0.5 s budget admits unchecked (fail_open), and says so
        if r.status_code != 200 or "rate limit not checked" not in caplog.text:
            break
        r = _post(gateway, "sk-capped")  # the loaded CI machine stalled once: only then ask again
    assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded"
    assert 1 <= int(r.headers["retry-after"]) <= 60
    assert _post(gateway, "bad-key").status_code == 401
    metrics = gateway.client.get("/metrics").text  # every decision is counted, the 429 as limited
    assert 'cascade_limiter_decisions_total{decision="limited",tenant="capped"} 1.0' in metrics
    assert 'cascade_limiter_decisions_total{decision="admitted",tenant="capped"}' in metrics
    # the Redis ledger's own count, once its writes (after the answers, off the response path) have landed
    until(lambda: 'cascade_ledger_records_total{outcome="recorded"}' in gateway.client.get("/metrics").text, 10)


def test_budget_rejects_once_spent(gateway: Gateway) -> None:
    assert _post(gateway, "sk-broke").status_code == 200  # costs > 100 micro-USD on the flagship
    deadline = time.monotonic() + 5
    while (r := _post(gateway, "sk-broke")).status_code == 200 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert r.status_code == 429 and r.json()["error"]["code"] == "insufficient_quota"
    now = datetime.now(UTC)
    midnight = datetime(now.year, now.month, now.day, tzinfo=UTC) + timedelta(days=1)
    message = r.json()["error"]["message"]
    assert "of its daily budget of 0.000100 USD" in message, message
    assert f"it resets at {midnight:%Y-%m-%dT%H:%M:%SZ} (UTC)" in message, message
    assert abs(int(r.headers["retry-after"]) - (midnight - now).total_seconds()) <= 2  # to the UTC day's end


def test_budget_downgrades_to_micro(gateway: Gateway) -> None:
    assert _post(gateway, "sk-thrifty").headers["x-cascade-pool"] == "flagship"
    deadline = time.monotonic() + 5
    while (r := _post(gateway, "sk-thrifty")).headers.get("x-cascade-pool") == "flagship":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert r.status_code == 200
    assert (r.headers["x-cascade-pool"], r.headers["x-cascade-rule"]) == ("micro", "budget-downgrade")


def test_a_request_refused_after_admission_gives_its_rate_limit_back(gateway: Gateway) -> None:
    # an unknown model is refused by routing, after admission: it must not use up the tenant's 2 requests a minute
    assert [_post(gateway, "sk-small", model="no-such-model").status_code for _ in range(3)] == [404] * 3
    assert [_post(gateway, "sk-small").status_code for _ in range(2)] == [200, 200]
    assert _post(gateway, "sk-small").status_code == 429  # the limit itself still holds


def test_parallel_requests_stop_at_the_budget(gateway_prefix: tuple[Gateway, str]) -> None:
    # 30 requests at once against a daily budget of 2000 micro-USD, each ~490 on the flagship (32 tokens at
    # $15/Mtok plus the prompt): every admission holds its worst case, so at most one request's cost goes over.
    # The tenant fails closed: a hold that could not reach Redis in time (a loaded CI machine, where one slow call
    # makes the guard treat Redis as down for a second) is a 503, where a fail_open tenant would be served
    # unchecked; a burst refused that way alone is sent again after that second, up to three times
    gateway, prefix = gateway_prefix
    assert _post(gateway, "sk-tight", max_tokens=32).status_code == 200  # warm: the scripts and connections are ready
    codes: list[int] = []
    with ThreadPoolExecutor(30) as pool:
        for _ in range(3):
            burst = list(pool.map(lambda _: _post(gateway, "sk-tight", max_tokens=32).status_code, range(30)))
            codes += burst
            if 429 in burst:
                break
            time.sleep(1.1)
    served = codes.count(200) + 1
    assert set(codes) <= {200, 429, 503} and 429 in codes, codes
    deadline = time.monotonic() + 30
    while len(costs := _costs(prefix, "tight")) < served and time.monotonic() < deadline:
        time.sleep(0.1)  # records are written in the background
    assert len(costs) == served
    print(f"1 + {len(codes)} requests (bursts of 30): {served} served, {sum(costs)} micro-USD spent of a 2000 "
          f"budget, {codes.count(503)} unchecked (503)")
    assert sum(costs) <= 2000 + max(costs), (served, costs)


def _costs(prefix: str, tenant: str) -> list[int]:
    return [int(r["cost_micro_usd"]) for r in ledger_records(SHARED_URL, prefix) if r["tenant"] == tenant]


def test_a_request_past_the_deadline_gives_its_limits_and_hold_back(make_gateway: GatewayFactory, tmp_path: Path,
                                                                     fake_upstreams: Upstreams, prefix: str) -> None:
    _, micro_url, _, flagship_url = fake_upstreams
    path = tmp_path / "policy.yaml"
    small = "rate_limits: {requests_per_minute: 2}"
    assert small in TENANTS
    path.write_text(policy_yaml(micro_url, flagship_url) + TENANTS.replace(small, small + ", budget: {daily_usd: '1'}"))
    gateway = make_gateway(path, scorer="none", ledger="redis", redis_prefix=prefix, deadline_s=0.3)
    slow = {"model": "micro", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8,
            "metadata": {"fake_delay_ms": "200"}}  # 8 tokens at 200 ms: far past the 0.3 s deadline
    codes = [gateway.client.post("/v1/chat/completions", json=slow, timeout=30,
                                 headers={"authorization": "Bearer sk-small"}).status_code for _ in range(3)]
    assert codes == [504] * 3  # not 504, 504, 429: each gave its request back
    holds = redis.Redis.from_url(SHARED_URL).hgetall(LedgerKeys(prefix).holds("small"))
    assert {k: int(v) for k, v in holds.items()} in ({}, {b" sum": 0})  # every hold released
    assert [_post(gateway, "sk-small", model="micro").status_code for _ in range(3)] == [200, 200, 429]
