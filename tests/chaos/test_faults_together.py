"""Chaos: the faults of `loadtest.scenarios.chaos` in turn and overlapping, shortened, under load from
`loadtest.load.generator`: a remote pool optional for readiness becomes unreachable, the real micro vLLM engine hangs
(SIGSTOP) and must be restarted by the supervisor's `hang_restart_after_s`, a private Redis is killed and started
again, with a fail_closed and a fail_open tenant, and, once the restarted engine is back, it is SIGKILLed (its whole
process group) while the gateway has a request in flight on it. Ends with no 5xx but the fail_closed 503s, no answer
cut off (a failure is an HTTP error or an error event in the stream), requests failed over to the flagship while the
killed engine restarted, every completed request recorded once in the ledger (the outbox replayed), both restarts
counted in `/metrics` (hung, exited), none of the killed group's processes left, the new engine core placed beside
its worker, and `/readyz` failing only for Redis or the required micro pool, never for the optional one.

What was `test_kill_engine.py` (its own gateway and engine, two starts) is the kill here: one engine start less.

Slow: one engine start and two restarts (1-2 minutes each on 2 shared cores), the load until the engine is back.
Most of that is waiting at 3 requests a second, so under pytest-xdist it runs beside the other engine tests (an xdist
group of its own) with its engine's worker bound to the host's last core, off the first cores vLLM binds every other
engine's worker to: no engine of another test shares its core, nor it theirs (`tests/conftest.py`).
"""

from __future__ import annotations

import os
import shutil

import pytest

from loadtest.scenarios.chaos import Faults, run_chaos
from loadtest.scenarios.chaos_figures import check_invariants, format_record
from loadtest.scenarios.cli import build_parser

pytestmark = [pytest.mark.engines, pytest.mark.xdist_group("chaos-engine"),
              pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs the redis-server binary")]
FAULTS = Faults(load_s=40, max_load_s=420, cloud_down_s=4, hang_s=8, redis_down_s=18, redis_up_s=28,
                hang_restart_after_s=6, kill_after_back_s=5)  # the load lasts until the engine killed after its
#                                                               restart has been back 10 s


def test_hang_kill_unreachable_pool_and_redis_outage_together_keep_the_invariants(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the gateway and its engines inherit this process's environment; the restarted engines too
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", str(max(os.sched_getaffinity(0))))
    args = build_parser().parse_args(["chaos", "--quiet", "--rate", "3", "--max-tokens", "24", "--settle-s", "45"])
    record = run_chaos(args, FAULTS)
    print(format_record(record))
    checks = check_invariants(record)
    assert all(c.ok for c in checks), [c for c in checks if not c.ok]
    assert any(c.name.startswith("the killed engine was restarted") for c in checks)  # the kill's checks ran
    client, answered = record["client"], record["client"]["answered"]
    # the faults were exercised, so the invariants above are not vacuous
    assert answered.get("strict 503 fail_closed", 0) >= 1, answered  # Redis was down while strict traffic came
    assert not any(k.startswith("lenient 503") for k in answered), answered
    assert client["in_flight_at_kill"] >= 1, client  # the kill cut requests (it waits for one in flight)
    assert record["restarts"].get("hung", 0) >= 1 and record["restarts"].get("exited", 0) >= 1, record["restarts"]
    spans = [state for _, _, state in record["readyz"]["spans"]]
    assert any("redis down" in s for s in spans) and any("micro down (required)" in s for s in spans), spans
    killed_at, back_at = client["kill_window_s"]
    assert any("micro down (required)" in s for _, end, s in record["readyz"]["spans"] if end >= killed_at), spans
    assert back_at < FAULTS.max_load_s, client  # back after the kill within the run
    assert any(s.startswith("200 degraded cloud") for s in spans), spans  # up, and saying cloud is down
    assert record["ledger"]["by_status"].get("ok", 0) == record["ledger"]["completed"] > 0
