"""`cascade policy explain --gateway|--redis-url` shows the threshold a running gateway routes with and where it came
from (initial, share-held, ladder-raised), and a reload switches the policy version and the threshold together."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import orjson
import pytest
import redis

from gateway.cli.main import main
from gateway.control.adaptation.live_threshold import window_key
from tests.conftest import SHARED_URL, GatewayFactory, policy_yaml
from tests.servers import until

pytestmark = pytest.mark.redis
LADDER = """degradation:
  steps:
    - name: kv-high
      signal: kv_cache_usage
      pool: flagship
      enter_above: 0.85
      exit_below: 0.70
      action: {type: raise_threshold, threshold: 0.97}
"""


def _share(share: float) -> str:
    return f"{{flagship_share: {share}, window: 200, min_samples: 50, initial: 0.95}}"


@pytest.fixture
def policy(tmp_path: Path, upstreams: tuple[object, str, object, str]) -> Path:
    _, micro_url, _, flagship_url = upstreams
    path = tmp_path / "policy.yaml"
    path.write_text(policy_yaml(micro_url, flagship_url).replace("  threshold: 0.5\n",
                                                                 f"  threshold: {_share(0.5)}\n") + LADDER)
    return path


@pytest.fixture
def gateway(make_gateway: GatewayFactory, policy: Path, prefix: str) -> str:
    """A gateway whose shared window holds 200 scores spread evenly over [0, 1) (as its traffic would leave it).
    Served (uvicorn): `policy explain --gateway` asks it over HTTP."""
    client = redis.Redis.from_url(SHARED_URL)
    client.lpush(window_key(prefix), *[f"{i / 200:.6f}|0" for i in range(200)])
    client.close()
    url = make_gateway(policy, served=True, ledger="redis", redis_prefix=prefix, admin_key="admin",
                       policy_watch_interval_s=0, access_log=None).url
    until(lambda: httpx.get(url + "/readyz").json()["routing"]["source"] == "share-held")
    return url


def _explain(capsys: pytest.CaptureFixture[str], policy: Path, *args: str) -> str:
    assert main(["policy", "explain", str(policy), "--prompt", "hi", "--score", "0.7", *args]) == 0
    return capsys.readouterr().out


def _in_use(out: str) -> float:
    found = re.search(r"^threshold in use: ([0-9.]+) \(", out, re.M)
    assert found is not None, out
    return float(found.group(1))


def test_explain_shows_the_threshold_the_gateway_uses_and_why(
        gateway: str, policy: Path, prefix: str, capsys: pytest.CaptureFixture[str]) -> None:
    offline = _explain(capsys, policy)
    assert "pool 'micro'" in offline and "`initial` 0.95" in offline  # the file alone: its initial
    live = _explain(capsys, policy, "--gateway", gateway)
    assert abs(_in_use(live) - 0.5) < 0.02 and "share-held" in live and "latest scores" in live
    assert "pool 'flagship'" in live  # 0.7 is above what the gateway uses
    from_redis = _explain(capsys, policy, "--redis-url", SHARED_URL, "--prefix", prefix)
    assert _in_use(from_redis) == _in_use(live) and "share-held" in from_redis
    quiet = _explain(capsys, policy, "--redis-url", SHARED_URL, "--prefix", prefix + "none:")
    assert _in_use(quiet) == 0.95 and "initial" in quiet  # no scores in that window


def test_explain_shows_a_ladder_raised_threshold(policy: Path, prefix: str, capsys: pytest.CaptureFixture[str]) -> None:
    client = redis.Redis.from_url(SHARED_URL)
    client.set(f"{prefix}ladder:{{sync}}:state", orjson.dumps({"active": {"kv-high": time.time()}, "at": time.time()}))
    client.close()
    out = _explain(capsys, policy, "--redis-url", SHARED_URL, "--prefix", prefix)
    assert _in_use(out) == 0.97 and "ladder-raised" in out and "ladder step 'kv-high'" in out


def test_a_reload_switches_policy_version_and_threshold_together(gateway: str, policy: Path) -> None:
    policy.write_text(policy.read_text().replace(_share(0.5), _share(0.1)))
    reloaded = httpx.post(gateway + "/admin/policy/reload", headers={"authorization": "Bearer admin"})
    assert reloaded.status_code == 200
    body = {"model": "auto", "messages": [{"role": "user", "content": "w " * 140}], "max_tokens": 4}  # score 0.7
    first = httpx.post(gateway + "/v1/chat/completions", json=body, timeout=30)  # at once: no refresh since
    assert first.status_code == 200 and first.headers["x-cascade-pool"] == "micro", first.headers
    routing = httpx.get(gateway + "/readyz").json()["routing"]
    assert routing["policy_version"] == reloaded.json()["policy_version"]
    assert abs(routing["threshold"] - 0.9) < 0.02 and routing["source"] == "share-held"
