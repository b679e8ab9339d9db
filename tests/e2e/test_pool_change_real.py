"""A pool's engines changed under steady load, on real vLLM engines, while two clients of the official `openai` SDK
(one streaming) keep sending to it, in one gateway:
1. the micro pool's `max_model_len` goes from 1024 to 2048: the new engine starts beside the old one and takes
   over once healthy, and the old engine stops after it drained;
2. a canary of the micro pool is added (a third engine), reweighted, and promoted (nothing starts: the canary is
   the pool).
No request fails in any of them. A canary rolled back (it drains and stops, its traffic back on the pool) is
`tests/gateway/control/test_canary.py`'s sequence on the real supervisor; a real engine draining, then stopping, is
step 1's old engine here: a second real canary only for its rollback was one engine start (40 s of CPU) more.
The figures of each change (its time, requests meanwhile, p99 before, during and after, the models that answered)
are printed for BENCHMARKS.md.

Slow: the demo micro engine starts, then two more, one after another (minutes on 2 CPU cores)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from backends.models.demo import models_root
from gateway.cli.demo import stop_process_group
from loadtest.fake_upstream import FakeUpstream
from loadtest.scenarios.change import edit_then_reload, figures, measure_change, reload_after_edit
from policies.canary_edit import promote_canary
from tests.conftest import delete_prefix
from tests.servers import free_port, serve, wait_ready

pytestmark = [pytest.mark.engines, pytest.mark.redis]

ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = float(os.environ.get("CASCADE_E2E_READY_TIMEOUT", "900"))
ADMIN = "e2e-pool-change-admin"
# Each client pauses between its requests: steady traffic that leaves the 2-core machine room to start the new
# engine beside the old ones (back to back, the serving engine and the starting one share vLLM's one worker
# core, and the new one did not start within its 600 s startup_timeout_s; the reload then said so, 422)
THINK_S = 0.5
FLAGSHIP = """  flagship:
    type: remote
    urls: ["{url}"]
    model: flagship
    price: {{input_per_mtok: "3.00", output_per_mtok: "15.00"}}
"""
MICRO = "      max_model_len: 1024\n      dtype: bfloat16\n      kv_cache_space_gib: 1\n      base_port: 8101\n"


def _engine_context(port: int) -> int | None:
    """The max_model_len the engine on `port` serves, or None where none answers."""
    try:
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).json()["data"]
    except (httpx.HTTPError, KeyError, ValueError):
        return None
    return int(models[0]["max_model_len"])


def _canary(served_name: str, port: int, weight: float) -> str:
    return f"""    canary:
      weight: {weight}
      engine:
        model: demo:micro
        served_name: {served_name}
        max_model_len: 1024
        dtype: bfloat16
        kv_cache_space_gib: 1
        base_port: {port}
        extra_args: ["--enforce-eager"]
        tool_calling: {{parser: pythonic}}
"""


def _with_canary(block: str) -> object:
    def edit(text: str) -> str:
        anchor = "      tool_calling: {parser: pythonic}\n"  # the micro pool's last engine line (the first pool)
        at = text.index(anchor) + len(anchor)
        return text[:at] + block + text[at:]

    return edit


@dataclass(frozen=True)
class Gateway:
    base: str
    policy: Path


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """The gateway with the shipped micro pool and its real engine, shared by this module's tests (in order). The
    flagship, which no request here reaches, is a remote pool on a fake upstream: one engine start less."""
    tmp_path = tmp_path_factory.mktemp("change")
    home = tmp_path / "home"
    home.mkdir()
    (home / "models").symlink_to(models_root(), target_is_directory=True)  # reuse the built demo models
    policy = tmp_path / "policy.yaml"
    shipped = (ROOT / "policies" / "default.yaml").read_text()
    assert shipped.count(MICRO) == 1, "the shipped micro pool changed: update this test"
    start, end = shipped.index("  flagship:\n    type: local\n"), shipped.index("\nrouting:\n")
    prefix = f"test:e2e:change:{uuid.uuid4().hex[:8]}:"
    port = free_port()
    log_path = tmp_path / "gateway.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CASCADE_ADMIN_KEY": ADMIN, "CASCADE_HOME": str(home)}
    env.pop("CASCADE_DEMO_MICRO", None)
    with serve(FakeUpstream("flagship")) as flagship:
        policy.write_text(shipped[:start] + FLAGSHIP.format(url=flagship) + shipped[end:])
        with log_path.open("wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--policy", str(policy), "--port",
                                     str(port), "--redis-prefix", prefix, "--scorer", "length"], stdout=log,
                                    stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)
        base = f"http://127.0.0.1:{port}"
        try:
            wait_ready(base, proc, READY_TIMEOUT_S, log_path.read_text, poll_s=1)
            yield Gateway(base, policy)
        finally:
            stop_process_group(proc)
            delete_prefix(prefix)


def _measured(gateway: Gateway, edit: object, name: str, steady_s: float = 4, after_s: float = 6) -> dict[str, object]:
    """Run one change under the two clients; its figures (printed), after checking the reload and every answer."""
    change = edit_then_reload(gateway.base, gateway.policy, edit, ADMIN)  # type: ignore[arg-type]
    response, began, applied, outcomes = asyncio.run(
        measure_change(gateway.base, change, clients=2, model="micro", steady_s=steady_s, after_s=after_s,
                       think_s=THINK_S))
    assert isinstance(response, httpx.Response)
    assert response.status_code == 200, response.text
    result = figures(outcomes, began, applied)
    print(f"\n{name} figures:", json.dumps(result))
    assert result["failed"] == 0, result["errors"]
    return result


def test_changing_the_micro_pools_context_under_load_loses_no_request(gateway: Gateway) -> None:
    base, policy = gateway.base, gateway.policy
    assert _engine_context(8101) == 1024
    edit = MICRO.replace("max_model_len: 1024", "max_model_len: 2048")
    change = reload_after_edit(base, policy, MICRO, edit, ADMIN)
    response, began, applied, outcomes = asyncio.run(
        measure_change(base, change, clients=2, model="micro", steady_s=6, after_s=6, think_s=THINK_S))
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


def test_a_canary_added_weighted_then_promoted_loses_no_request(gateway: Gateway) -> None:
    # 10 s after: about 15 answers at weight 0.5, so at least 2 from each side but with odds of about 1 in 1,000
    added = _measured(gateway, _with_canary(_canary("micro-v2", 8131, 0.5)), "canary added", after_s=10)
    assert added["after"]["models"].get("micro-v2", 0) >= 2, added  # type: ignore[index]
    assert added["after"]["models"].get("micro", 0) >= 2, added  # type: ignore[index]
    versions = httpx.get(gateway.base + "/readyz").json()["versions"]["micro"]
    assert versions["canary"]["ready"] is True and versions["canary"]["model"] == "micro-v2"

    weighted = _measured(gateway, lambda text: text.replace("weight: 0.5", "weight: 0.9", 1), "canary weighted")
    assert weighted["change_s"] < 30, weighted  # type: ignore[operator]  # no engine started (one takes minutes)

    promoted = _measured(gateway, lambda text: promote_canary(text, "micro"), "canary promoted")
    assert promoted["after"]["models"] == {"micro-v2": promoted["after"]["requests"]}, promoted  # type: ignore[index]
    assert httpx.get(gateway.base + "/readyz").json()["versions"]["micro"] == {"version": versions["canary"]["version"]}
    assert _engine_context(8131) == 1024  # the canary's engine is the pool's now: nothing restarted

