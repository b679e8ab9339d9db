"""Chaos: SIGKILL a real vLLM engine replica (its whole process group) under load, with the gateway's
engine supervisor running it. Requests in flight fail over to the other pool or fail cleanly (an OpenAI
error body, in the stream if it had started; never a hang or a cut-off answer), the supervisor restarts
the engine (the killed group gone, the new engine core placed beside its worker), traffic returns to it, and
the ledger reconciles with the client's count.

One real engine (the micro pool, demo model) is started once; the flagship pool is a fake engine the
policy fails over to. Slow: an engine start is 1-3 minutes on 2 CPU cores, and the test waits for two.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from backends.engines.supervisor import EngineSupervisor, live_group_members
from backends.models.demo import models_root
from gateway.api.app import create_app
from gateway.api.runtime import Runtime
from gateway.settings import Settings
from loadtest.fake_upstream import FakeUpstream
from tests.chaos.traffic import Kind, Traffic, reconcile
from tests.conftest import SHARED_URL
from tests.engines import assert_engine_cores_placed
from tests.servers import free_port, serve

pytestmark = [pytest.mark.engines, pytest.mark.redis]
START_TIMEOUT_S = float(os.environ.get("CASCADE_E2E_READY_TIMEOUT", "900"))

POLICY = """
version: 1
pools:
  micro:
    type: local
    price: {{input_per_mtok: "0.20", output_per_mtok: "0.20"}}
    engine:
      model: demo:micro
      served_name: micro
      replicas: 1
      max_model_len: 1024
      dtype: bfloat16
      kv_cache_space_gib: 1
      base_port: {port}
      startup_timeout_s: {timeout}
      extra_args: ["--enforce-eager"]
  flagship:
    type: remote
    urls: ["{flagship}"]
    model: flagship-model
    price: {{input_per_mtok: "3.00", output_per_mtok: "15.00"}}
routing:
  micro_pool: micro
  flagship_pool: flagship
  failover: true
"""


def _body(i: int) -> dict[str, Any]:
    """`auto` (no scorer: the micro pool, failover allowed). Every third request is a long stream, so that
    some are mid-answer when the engine dies."""
    body: dict[str, Any] = {"model": "auto", "messages": [{"role": "user", "content": f"Tell me about {i}."}],
                            "max_tokens": 12}
    if i % 3 == 0:
        body.update(max_tokens=300, ignore_eos=True)  # vLLM: generate all 300 tokens
    if i % 3 == 0 or i % 2 == 0:
        body.update(stream=True, stream_options={"include_usage": True})  # vLLM refuses it without stream
    return body


@pytest.fixture
def gateway(tmp_path: Path, prefix: str) -> Iterator[tuple[str, Runtime]]:
    (tmp_path / "models").symlink_to(models_root(), target_is_directory=True)  # reuse the built demo models
    with serve(FakeUpstream("flagship-model")) as flagship:
        policy = tmp_path / "policy.yaml"
        policy.write_text(POLICY.format(port=free_port(), timeout=START_TIMEOUT_S, flagship=flagship))
        settings = Settings(policy_path=policy, scorer="none", start_engines=True, ledger="redis",
                            redis_url=SHARED_URL, redis_prefix=prefix, home=tmp_path, policy_watch_interval_s=0,
                            probe_interval_s=0.5)
        app = create_app(settings)
        with serve(app) as url:
            yield url, app.state.runtime


async def _supervisor(runtime: Runtime) -> EngineSupervisor:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not runtime.pool_set.status.get("micro", "").startswith("ready"):
        status = runtime.pool_set.status.get("micro", "")
        if status.startswith("failed") or time.monotonic() > deadline:
            log = next(iter(sorted(runtime.settings.home.glob("logs/micro-*.log"))), None)
            pytest.fail(f"engine not ready ({status}): {log.read_text()[-3000:] if log else ''}")
        await asyncio.sleep(1)
    return runtime.pool_set.supervisors["micro"]


async def test_killed_engine_fails_over_restarts_and_reconciles(gateway: tuple[str, Runtime], prefix: str) -> None:
    url, runtime = gateway
    started = time.monotonic()
    sup = await _supervisor(runtime)
    engine = sup.replicas[0]
    pool = runtime.pools["micro"]
    first_start_s = time.monotonic() - started
    traffic = Traffic(url, _body, concurrency=4, timeout_s=60, pause_s=0.05)
    traffic.start()
    try:
        await traffic.wait_for(
            lambda: sum(o.pool == "micro" and o.kind is Kind.COMPLETED for o in traffic.outcomes) >= 12, 120,
            "traffic served by the engine")
        old_pid = engine.pid
        assert old_pid is not None
        os.killpg(old_pid, signal.SIGKILL)
        killed_at = time.monotonic()
        await traffic.wait_for(lambda: engine.pid not in (None, old_pid) and engine.ready, START_TIMEOUT_S,
                               "the supervisor to restart the engine")
        restarted_s = time.monotonic() - killed_at
        assert live_group_members(old_pid) == []  # the killed engine's whole group is gone (its workers too)
        assert_engine_cores_placed({"micro": sup})  # the new engine core is placed beside its worker again
        back_at = time.monotonic()
        await traffic.wait_for(
            lambda: sum(o.pool == "micro" and o.kind is Kind.COMPLETED and o.started > back_at
                        for o in traffic.outcomes) >= 12, 60, "traffic back on the restarted engine")
    finally:
        outcomes = await traffic.stop()
    during = [o for o in outcomes if killed_at - 1 < o.ended and o.started < back_at]
    print(f"engine ready in {first_start_s:.0f} s, restarted in {restarted_s:.0f} s; overall {traffic.count()}; "
          f"around the kill: {Counter((o.kind.value, o.pool or '-') for o in during)}")
    broken = [o for o in outcomes if o.kind in (Kind.BROKEN, Kind.REFUSED)]
    assert not broken, broken[:3]
    failed = [o for o in outcomes if o.kind is Kind.FAILED]
    assert all(killed_at - 1 < o.ended < back_at + 5 for o in failed), failed[:3]  # only around the kill
    assert any(o.pool == "flagship" and o.kind is Kind.COMPLETED for o in during)  # failed over meanwhile
    assert all(o.ended - o.started < 30 for o in outcomes)  # no hang
    assert pool.ready and engine.restarts == 1
    summary = await reconcile(outcomes, SHARED_URL, prefix)
    print(f"ledger: {summary}; failed cleanly: {len(failed)}; breaker opened {pool.replicas[0].breaker.opened}x")
