"""Requests generated from the published request schema (every optional field absent, `null` or set), sent to a
real vLLM engine directly and through the gateway: the gateway serves what the engine serves, and what the
engine refuses comes back with the engine's status and message. One demo micro engine; a few minutes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.cli.demo import stop_process_group
from tests.openai_requests import requests
from tests.servers import ROOT, free_port, wait_ready

pytestmark = pytest.mark.engines

READY_TIMEOUT_S = float(os.environ.get("CASCADE_E2E_READY_TIMEOUT", "900"))
TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=24)
AFFORDABLE = {
    "model": st.just("auto"),
    "max_tokens": st.integers(1, 4),
    "max_completion_tokens": st.integers(1, 4),
    "n": st.integers(1, 2),
    "content": TEXT | st.none(),
    "metadata": st.dictionaries(st.from_regex(r"[a-z]{1,8}", fullmatch=True), TEXT, max_size=2),
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(gateway URL, engine URL): one local demo micro engine; the flagship pool is the same engine."""
    tmp = tmp_path_factory.mktemp("openai-real")
    engine_port, port = free_port(), free_port()
    engine = f"http://127.0.0.1:{engine_port}"
    policy = tmp / "policy.yaml"
    policy.write_text(f"""version: 1
pools:
  micro:
    type: local
    price: {{input_per_mtok: "0.20", output_per_mtok: "0.20"}}
    engine: {{model: "demo:micro", served_name: micro, replicas: 1, max_model_len: 512, dtype: bfloat16,
              kv_cache_space_gib: 1, base_port: {engine_port}, extra_args: ["--enforce-eager"]}}
  flagship:
    type: remote
    urls: ["{engine}"]
    model: micro
    price: {{input_per_mtok: "3.00", output_per_mtok: "15.00"}}
routing: {{micro_pool: micro, flagship_pool: flagship, threshold: 0.5}}
""")
    log_path = tmp / "gateway.log"
    cmd = [sys.executable, "-m", "gateway", "serve", "--policy", str(policy), "--port", str(port), "--ledger", "memory",
           "--scorer", "length", "--home", str(tmp)]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
                                env={**os.environ, "HF_HUB_OFFLINE": "1"})
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, proc, READY_TIMEOUT_S, log_path.read_text, poll_s=2)
        yield base, engine
    finally:
        stop_process_group(proc)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=requests(AFFORDABLE))
def test_the_gateway_serves_what_the_engine_serves(served: tuple[str, str], body: dict[str, Any]) -> None:
    gateway, engine = served
    as_json = {"content-type": "application/json"}
    # The gateway treats a top-level `null` as "not set" (the API allows it) and does not send it on, so the
    # engine is asked what the gateway asks it: the same body without those nulls.
    sent = {k: v for k, v in body.items() if v is not None}
    direct = httpx.post(engine + "/v1/chat/completions", content=json.dumps(dict(sent, model="micro")),
                        headers=as_json, timeout=60)
    routed = httpx.post(gateway + "/v1/chat/completions", content=json.dumps(body), headers=as_json, timeout=60)
    assert routed.status_code == direct.status_code, (body, direct.text, routed.text)
    if direct.status_code >= 400:
        engine_message = direct.json()["error"]["message"] if "error" in direct.json() else direct.json()["message"]
        assert engine_message in routed.json()["error"]["message"], (body, direct.text, routed.text)
    elif not body.get("stream"):
        assert len(routed.json()["choices"]) == (body.get("n") or 1)
