"""A request's trace runs into a real vLLM engine (demo micro model): with OTLP configured, the gateway starts its
local engine with vLLM's own export, and the engine's request span (`llm_request`) arrives at the same receiver as a
child of the gateway's `engine micro` span, under the client's trace, named as the engine's service."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from backends.models.demo import models_root
from gateway.api.app import create_app
from gateway.settings import Settings
from tests.gateway.serving.test_tracing import TRACE_ID, Receiver
from tests.servers import free_port, serve

pytestmark = pytest.mark.engines

POLICY = """version: 1
pools:
  micro:
    type: local
    price: {{input_per_mtok: "0.20", output_per_mtok: "0.20"}}
    engine: {{model: "demo:micro", served_name: micro, max_model_len: 1024, dtype: bfloat16, kv_cache_space_gib: 1,
              base_port: {port}, extra_args: ["--enforce-eager"], startup_timeout_s: 600}}
  flagship:
    type: remote
    urls: ["http://127.0.0.1:9/v1"]
    model: flagship-model
    price: {{input_per_mtok: "3.00", output_per_mtok: "15.00"}}
routing: {{micro_pool: micro, flagship_pool: flagship, threshold: 0.5}}
"""


def test_the_engines_span_is_a_child_of_the_gateways(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "models").symlink_to(models_root(), target_is_directory=True)
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.format(port=free_port()))
    receiver = Receiver()
    with serve(receiver) as collector:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", collector + "/v1/traces")
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")  # the engines inherit it: they export within 50 ms too
        app = create_app(Settings(policy_path=policy, scorer="none", ledger="memory", home=tmp_path, access_log=None))
        with serve(app) as url:
            deadline = time.monotonic() + 600
            while httpx.get(url + "/readyz", timeout=10).status_code != 200:
                assert time.monotonic() < deadline, "the engine did not start"
                time.sleep(1)
            body = {"model": "micro", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
            answer = httpx.post(url + "/v1/chat/completions", json=body, timeout=120,
                                headers={"traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01"})
            assert answer.status_code == 200, answer.text
            deadline = time.monotonic() + 60
            while not any(s["name"] == "llm_request" for s in receiver.spans):
                assert time.monotonic() < deadline, [s["name"] for s in receiver.spans]
                time.sleep(0.2)
    ours = [s for s in receiver.spans if s["trace_id"] == TRACE_ID]
    attempt = next(s for s in ours if s["name"] == "engine micro")
    engine = next(s for s in ours if s["name"] == "llm_request")
    assert engine["parent"] == attempt["span_id"]  # the engine's span under the gateway's attempt
    assert attempt["attrs"]["gen_ai.provider.name"] == "vllm"
    assert engine["attrs"]["gen_ai.usage.completion_tokens"] > 0
