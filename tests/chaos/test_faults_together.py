"""Chaos: the faults of `loadtest.scenarios.chaos` in turn and overlapping, shortened, under load from
`loadtest.load.generator`: a remote pool optional for readiness becomes unreachable, the real micro vLLM engine hangs
(SIGSTOP) and must be restarted by the supervisor's `hang_restart_after_s`, and a private Redis is killed and
started again, with a fail_closed and a fail_open tenant. Ends with no 5xx but the fail_closed 503s, every
completed request recorded once in the ledger (the outbox replayed), the restart counted in `/metrics`, and
`/readyz` failing only for Redis or the required micro pool, never for the optional one.

Slow: one engine start and one restart (1-2 minutes each on 2 shared cores), the load until the engine is back.
"""

from __future__ import annotations

import shutil

import pytest

from loadtest.scenarios.chaos import Faults, run_chaos
from loadtest.scenarios.chaos_figures import check_invariants, format_record
from loadtest.scenarios.cli import build_parser

pytestmark = [pytest.mark.engines,
              pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs the redis-server binary")]
FAULTS = Faults(load_s=40, max_load_s=240, cloud_down_s=4, hang_s=8, redis_down_s=18, redis_up_s=28,
                hang_restart_after_s=6)  # the load lasts until the restarted engine has served 10 s


def test_hang_unreachable_pool_and_redis_outage_together_keep_the_invariants() -> None:
    args = build_parser().parse_args(["chaos", "--quiet", "--rate", "3", "--max-tokens", "12", "--settle-s", "45"])
    record = run_chaos(args, FAULTS)
    print(format_record(record))
    checks = check_invariants(record)
    assert all(c.ok for c in checks), [c for c in checks if not c.ok]
    answered = record["client"]["answered"]
    # the faults were exercised, so the invariants above are not vacuous
    assert answered.get("strict 503 fail_closed", 0) >= 1, answered  # Redis was down while strict traffic came
    assert not any(k.startswith("lenient 503") for k in answered), answered
    spans = [state for _, _, state in record["readyz"]["spans"]]
    assert any("redis down" in s for s in spans) and any("micro down (required)" in s for s in spans), spans
    assert any(s.startswith("200 degraded cloud") for s in spans), spans  # up, and saying cloud is down
    assert record["ledger"]["by_status"].get("ok", 0) == record["ledger"]["completed"] > 0
