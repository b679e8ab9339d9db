"""Redis unreachable through a real gateway: each tenant's `on_redis_outage` decides. fail_closed tenants get
503 with an OpenAI error body, fail_open tenants are served unchecked, tenants without limits are served;
metrics count it, the log says so once (not once per request), and checks resume when Redis returns.

Uses a private redis-server on a free port that the test stops and restarts; the shared Redis is not touched.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.api.app import create_app
from gateway.api.auth import hash_key
from gateway.settings import Settings
from tests.conftest import policy_yaml
from tests.servers import PrivateRedis, serve

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs the redis-server binary")
Upstreams = tuple[Any, str, Any, str]
TENANTS = f"""tenants:
  strict: {{api_key_sha256: ['{hash_key("sk-strict")}'], rate_limits: {{requests_per_minute: 1000}},
            on_redis_outage: fail_closed}}
  lenient: {{api_key_sha256: ['{hash_key("sk-lenient")}'], rate_limits: {{requests_per_minute: 1000}}}}
  frugal: {{api_key_sha256: ['{hash_key("sk-frugal")}'], budget: {{daily_usd: "100"}}, on_redis_outage: fail_closed}}
  free: {{api_key_sha256: ['{hash_key("sk-free")}'], on_redis_outage: fail_closed}}
"""
KEYS = ("sk-strict", "sk-lenient", "sk-frugal", "sk-free")


def _post(url: str, key: str) -> httpx.Response:
    body = {"model": "micro", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    return httpx.post(url + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"},
                      timeout=10)


def _codes(url: str) -> dict[str, int]:
    return {key: _post(url, key).status_code for key in KEYS}


def _metric(url: str, name: str, **labels: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


def test_each_tenant_policy_applies_while_redis_is_down(
    tmp_path: Path, upstreams: Upstreams, private_redis: PrivateRedis, caplog: pytest.LogCaptureFixture
) -> None:
    _, micro_url, _, flagship_url = upstreams
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml(micro_url, flagship_url) + TENANTS)
    settings = Settings(policy_path=policy, scorer="none", start_engines=False, ledger="redis",
                        redis_url=private_redis.url, redis_prefix="outage:", home=tmp_path, policy_watch_interval_s=0)
    with serve(create_app(settings)) as url, caplog.at_level(logging.INFO, logger="cascade.admission"):
        assert _codes(url) == dict.fromkeys(KEYS, 200)  # Redis up: every check runs

        private_redis.kill()
        time.sleep(1.1)  # past the budget guard's 1 s spend cache, which still answers from what it read
        rounds = [_codes(url) for _ in range(8)]
        assert rounds == [{"sk-strict": 503, "sk-lenient": 200, "sk-frugal": 503, "sk-free": 200}] * 8
        refused = _post(url, "sk-strict")
        assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1
        error = refused.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert (error["type"], error["code"]) == ("service_unavailable", "limits_unavailable")
        assert "strict" in error["message"] and "Traceback" not in refused.text

        unchecked = "cascade_admission_unchecked_total"
        assert _metric(url, unchecked, tenant="strict", check="rate_limit", policy="fail_closed") == 9
        assert _metric(url, unchecked, tenant="lenient", check="rate_limit", policy="fail_open") == 8
        assert _metric(url, unchecked, tenant="frugal", check="budget", policy="fail_closed") == 8
        assert _metric(url, unchecked, tenant="free") == 0  # nothing to check: never refused, never counted
        assert _metric(url, "cascade_admission_store_unreachable", check="rate_limit") == 1
        assert _metric(url, "cascade_admission_store_unreachable", check="budget") == 1
        warnings = [r.getMessage() for r in caplog.records
                    if r.name == "cascade.admission" and r.levelno == logging.WARNING]
        assert len(warnings) == 3, warnings  # one per check and policy, not one per request
        assert sum("fail_closed: refused with 503" in w for w in warnings) == 2

        private_redis.start()
        deadline = time.monotonic() + 10
        while (codes := _codes(url)) != dict.fromkeys(KEYS, 200):
            assert time.monotonic() < deadline, codes
            time.sleep(0.2)
        assert _metric(url, "cascade_admission_store_unreachable", check="rate_limit") == 0
        assert _metric(url, "cascade_admission_store_unreachable", check="budget") == 0
    assert any("checked again" in r.getMessage() for r in caplog.records if r.name == "cascade.admission")
