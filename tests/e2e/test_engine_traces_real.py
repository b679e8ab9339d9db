"""A request's trace runs into a real vLLM engine (the shared demo micro engine): an engine started with OTLP export
(`traces_to`, as a traced gateway starts its local engines: `tests/backends/engines/test_engine_tracing.py`) sends its
request span (`llm_request`) to the same receiver as the gateway, as a child of the gateway's `engine micro` span,
under the client's trace. The session's shared engines export to `engine_spans` (`tests/conftest.py`), so this needs
no engine start of its own."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import ENGINE_TRACE_ID
from tests.engines import SharedEngines, demo_policy_text, gateway_on_shared_engines
from tests.gateway.serving.test_tracing import Receiver

pytestmark = pytest.mark.engines


def test_the_engines_span_is_a_child_of_the_gateways(tmp_path: Path, prefix: str, shared_engines: SharedEngines,
                                                      engine_spans: Receiver) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(demo_policy_text())
    env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": engine_spans.url + "/v1/traces", "OTEL_BSP_SCHEDULE_DELAY": "50"}
    with gateway_on_shared_engines(shared_engines, policy, prefix, ["--scorer", "none"], env=env) as gateway:
        body = {"model": "micro", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
        answer = httpx.post(gateway.url + "/v1/chat/completions", json=body, timeout=120,
                            headers={"traceparent": f"00-{ENGINE_TRACE_ID}-00f067aa0ba902b7-01"})
        assert answer.status_code == 200, answer.text
        deadline = time.monotonic() + 60  # the engine exports in batches, every 5 s by default
        while not {"llm_request", "engine micro"} <= {s["name"] for s in engine_spans.spans}:
            assert time.monotonic() < deadline, [s["name"] for s in engine_spans.spans]
            time.sleep(0.2)
    ours = [s for s in engine_spans.spans if s["trace_id"] == ENGINE_TRACE_ID]
    attempt = next(s for s in ours if s["name"] == "engine micro")
    engine = next(s for s in ours if s["name"] == "llm_request")
    assert engine["parent"] == attempt["span_id"]  # the engine's span under the gateway's attempt
    assert attempt["attrs"]["gen_ai.provider.name"] == "vllm"
    assert engine["attrs"]["gen_ai.usage.completion_tokens"] > 0
