"""The two ladder signals the gateway measures itself, through a real gateway: `ttft_p95_s` (time to first
token of its own streamed requests) and `error_rate` (its requests that found no engine). The HTTP ladder
tests drive the two scraped signals (KV cache use, queue depth) only."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx

from gateway.api.app import create_app
from gateway.settings import Settings
from tests.conftest import Upstreams, policy_yaml
from tests.servers import free_port, serve, until


def _post(url: str, model: str, **body: Any) -> httpx.Response:
    payload = {"model": model, "messages": [{"role": "user", "content": "hello"}], **body}
    return httpx.post(url + "/v1/chat/completions", json=payload, timeout=10)


def _settings(tmp_path: Path, text: str) -> Settings:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return Settings(policy_path=path, scorer="length", start_engines=False, ledger="memory", home=tmp_path,
                    probe_interval_s=0.1)


def test_slow_first_tokens_engage_a_ttft_step(tmp_path: Path, upstreams: Upstreams) -> None:
    _, micro_url, _, flagship_url = upstreams
    step = """degradation:
  steps:
    - {name: slow-flagship, signal: ttft_p95_s, pool: flagship, enter_above: 0.2, exit_below: 0.05, hold_s: 0,
       action: {type: fallback_pool, to_pool: micro}}
"""
    with serve(create_app(_settings(tmp_path, policy_yaml(micro_url, flagship_url) + step))) as url:
        fast = _post(url, "flagship", stream=True, metadata={"fake_tokens": "3"})
        assert fast.headers["x-cascade-pool"] == "flagship"
        time.sleep(0.5)
        assert "x-cascade-degraded" not in _post(url, "flagship").headers  # fast first tokens: calm
        slow = _post(url, "flagship", stream=True, metadata={"fake_tokens": "2", "fake_delay_ms": "400"})
        assert slow.status_code == 200 and slow.headers["x-cascade-pool"] == "flagship"
        until(lambda: _post(url, "flagship").headers["x-cascade-pool"] == "micro")
        r = _post(url, "flagship")
        assert (r.headers["x-cascade-rule"], r.headers["x-cascade-degraded"]) == ("ladder:slow-flagship",
                                                                                 "slow-flagship")


def test_failing_requests_engage_an_error_rate_step(tmp_path: Path, upstreams: Upstreams) -> None:
    _, micro_url, _, flagship_url = upstreams
    dead = f"""  ghost:
    type: remote
    urls: ["http://127.0.0.1:{free_port()}"]
    model: ghost-model
    price: {{input_per_mtok: "1.00", output_per_mtok: "1.00"}}
"""
    step = """degradation:
  steps:
    - {name: ghost-failing, signal: error_rate, pool: ghost, enter_above: 0.5, exit_below: 0.1, hold_s: 0,
       action: {type: fallback_pool, to_pool: micro}}
"""
    text = policy_yaml(micro_url, flagship_url).replace("pools:\n", "pools:\n" + dead, 1) + step
    with serve(create_app(_settings(tmp_path, text))) as url:
        assert _post(url, "ghost").status_code == 503  # nothing listens there
        until(lambda: _post(url, "ghost").status_code == 200)
        r = _post(url, "ghost")
        assert (r.headers["x-cascade-pool"], r.headers["x-cascade-rule"]) == ("micro", "ladder:ghost-failing")
