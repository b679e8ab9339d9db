"""A pool's engines changed under steady load, on real vLLM engines: the micro pool's `max_model_len` goes from
1024 to 2048 while two clients of the official `openai` SDK (one streaming) keep sending to it. The new engine
starts beside the old one and takes over once healthy; no request fails, and the old engine stops after it
drained. The figures (change time, requests meanwhile, p99 before/during/after) are printed for BENCHMARKS.md.

Slow: both demo engines start, then a third one (minutes on 2 CPU cores)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from gateway.cli.demo import stop_process_group
from loadtest.scenarios.change import figures, measure_change, reload_after_edit
from tests.conftest import delete_prefix
from tests.servers import free_port, wait_ready

pytestmark = [pytest.mark.engines, pytest.mark.redis]

ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = float(os.environ.get("CASCADE_E2E_READY_TIMEOUT", "900"))
ADMIN = "e2e-pool-change-admin"
# Each client pauses between its requests: steady traffic that leaves the 2-core machine room to start the new
# engine beside the old ones (back to back, the serving engine and the starting one share vLLM's one worker
# core, and the new one did not start within its 600 s startup_timeout_s; the reload then said so, 422)
THINK_S = 0.5
MICRO = "      max_model_len: 1024\n      dtype: bfloat16\n      kv_cache_space_gib: 1\n      base_port: 8101\n"


def _engine_context(port: int) -> int | None:
    """The max_model_len the engine on `port` serves, or None where none answers."""
    try:
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).json()["data"]
    except (httpx.HTTPError, KeyError, ValueError):
        return None
    return int(models[0]["max_model_len"])


def test_changing_the_micro_pools_context_under_load_loses_no_request(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    shipped = (ROOT / "policies" / "default.yaml").read_text()
    assert shipped.count(MICRO) == 1, "the shipped micro pool changed: update this test"
    policy.write_text(shipped)
    prefix = f"test:e2e:change:{uuid.uuid4().hex[:8]}:"
    port = free_port()
    log_path = tmp_path / "gateway.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CASCADE_ADMIN_KEY": ADMIN, "CASCADE_HOME": str(tmp_path / "home")}
    env.pop("CASCADE_DEMO_MICRO", None)
    with log_path.open("wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--policy", str(policy), "--port",
                                 str(port), "--redis-prefix", prefix], stdout=log, stderr=subprocess.STDOUT,
                                env=env, cwd=ROOT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, proc, READY_TIMEOUT_S, log_path.read_text, poll_s=2)
        assert _engine_context(8101) == 1024
        edit = MICRO.replace("max_model_len: 1024", "max_model_len: 2048")
        change = reload_after_edit(base, policy, MICRO, edit, ADMIN)
        response, began, applied, outcomes = asyncio.run(
            measure_change(base, change, clients=2, model="micro", steady_s=15, after_s=15, think_s=THINK_S))
        assert isinstance(response, httpx.Response)
        assert response.status_code == 200, response.text
        result = figures(outcomes, began, applied)
        print("\npool change figures:", json.dumps(result))
        assert result["failed"] == 0, result["errors"]
        assert result["during"]["requests"] >= 4 and result["after"]["requests"] >= 4
        new_port = next(p for p in range(8102, 8120) if _engine_context(p) == 2048)
        engines = httpx.get(base + "/readyz").json()["engines"]["micro"]
        assert "version 1" in engines, engines
        deadline = time.monotonic() + 120
        while _engine_context(8101) is not None:  # the old version drained, then stopped
            assert time.monotonic() < deadline, "the old micro engine is still up"
            time.sleep(1)
        assert _engine_context(new_port) == 2048
    finally:
        stop_process_group(proc)
        delete_prefix(prefix)
