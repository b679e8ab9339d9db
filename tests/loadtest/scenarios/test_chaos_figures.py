"""The chaos run's figures and checks on hand-made records: each invariant fails on the fault it is there to see
(so that a passing run means something), and /readyz 503s are told apart by their reason."""

from __future__ import annotations

from typing import Any

from loadtest.load.client import Sample
from loadtest.scenarios.chaos_figures import check_invariants, client_view, readiness


def _poll(t: float, status: int, redis: bool = True, micro: bool = True, cloud: bool = True) -> dict[str, Any]:
    pools = {"micro": micro, "flagship": True, "cloud": cloud}
    return {"t": t, "status": status, "redis": redis, "pools": pools, "required": ["micro"],
            "degraded": [] if cloud else ["cloud"]}


def _record(**changes: Any) -> dict[str, Any]:
    polls = [_poll(0, 200), _poll(1, 200, cloud=False), _poll(2, 503, micro=False, cloud=False),
             _poll(3, 503, redis=False, micro=False, cloud=False), _poll(4, 200, cloud=False)]
    ok = Sample("chaos", "short-easy", "lenient", 5.0, status=200, pool="micro", request_id="a")
    record = {"client": client_view([ok], hang_s=1.0),
              "ledger": {"completed": 1, "by_status": {"ok": 1}, "lost": [], "twice": [], "wrong_tokens": [],
                         "rollups_ok": True},
              "restarts": {"hung": 1.0}, "engine_pid": {"hung": [10], "after": 11}, "readyz": readiness(polls)}
    record.update(changes)
    return record


def _failed(record: dict[str, Any]) -> list[str]:
    return [c.name for c in check_invariants(record) if not c.ok]


def test_a_run_that_kept_every_promise_passes_every_check() -> None:
    assert _failed(_record()) == []


def test_each_broken_promise_fails_its_own_check() -> None:
    record = _record()
    lost = {**record["ledger"], "lost": ["a"]}
    bad_5xx = client_view([Sample("chaos", "short-easy", "lenient", 5.0, status=503, error="HTTP 503: engine")], 1.0)
    bad_ready = readiness([_poll(0, 200), _poll(1, 503, cloud=False)])  # up but for the optional pool: a lie
    cases = {"no lost cost record": _record(ledger=lost),
             "no 5xx but the fail_closed 503s": _record(client={**bad_5xx, "micro_served_after_hang": 1}),
             "the hung engine was restarted and counted": _record(restarts={}),
             "the micro engine serves again": _record(client={**record["client"], "micro_served_after_hang": 0}),
             "/readyz never failed because of the optional cloud pool": _record(readyz=bad_ready)}
    for prefix, case in cases.items():
        failed = _failed(case)
        assert len(failed) == 1 and failed[0].startswith(prefix), (prefix, failed)


def test_a_fail_closed_503_of_the_strict_tenant_is_deliberate_any_other_is_not() -> None:
    closed = "HTTP 503: The rate limits of tenant 'strict' cannot be checked right now"
    view = client_view([Sample("chaos", "k", "strict", 1.0, status=503, error=closed),
                        Sample("chaos", "k", "lenient", 1.0, status=503, error=closed)], hang_s=0.0)
    assert view["answered"] == {"strict 503 fail_closed": 1, "lenient 503": 1} and view["unexpected_5xx"] == 1


def test_readiness_spans_name_each_503s_reason() -> None:
    spans = [s for _, _, s in _record()["readyz"]["spans"]]
    assert spans == ["200", "200 degraded cloud", "503 micro down (required)",
                     "503 redis down, micro down (required)", "200 degraded cloud"]


def _killed_run(**changes: Any) -> dict[str, Any]:
    """A run whose engine was SIGKILLed at 10 s and was back at 20 s: a stream in flight failed cleanly, a request
    failed over meanwhile, micro served again after."""
    samples = [Sample("chaos", "k", "lenient", 5.0, status=200, pool="micro", request_id="a", e2e_s=1.0),
               Sample("chaos", "k", "lenient", 9.5, status=200, error="stream error: engine gone", e2e_s=0.8),
               Sample("chaos", "k", "lenient", 12.0, status=200, pool="flagship", request_id="b", e2e_s=0.1),
               Sample("chaos", "k", "lenient", 25.0, status=200, pool="micro", request_id="c", e2e_s=0.5)]
    record = _record(client=client_view(samples, hang_s=1.0, kill_window=(10.0, 20.0)),
                     restarts={"hung": 1.0, "exited": 1.0}, engine_pid={"hung": [10], "killed": [11], "after": 12},
                     killed_group_left={11: []}, placement={"placed": True})
    record.update(changes)
    return record


def test_a_killed_engine_run_that_kept_every_promise_passes_and_counts_what_was_in_flight() -> None:
    record = _killed_run()
    assert _failed(record) == []
    client = record["client"]
    assert (client["in_flight_at_kill"], client["failed_at_kill"], client["failed_over_after_kill"],
            client["micro_served_after_kill"]) == (1, 1, 1, 1)


def test_each_broken_promise_of_a_kill_fails_its_own_check() -> None:
    client = _killed_run()["client"]
    cut = client_view([Sample("chaos", "k", "lenient", 9.5, status=200, error="stream ended without [DONE]"),
                       Sample("chaos", "k", "lenient", 9.6)], hang_s=1.0, kill_window=(10.0, 20.0))
    cases = {"the killed engine was restarted and counted": [_killed_run(restarts={"hung": 1.0}),
                                                             _killed_run(killed_group_left={11: [13]})],
             "the restarted engine core is placed": [_killed_run(placement={"placed": False})],
             "requests failed over to flagship": [_killed_run(client={**client, "failed_over_after_kill": 0})],
             "the micro engine serves again after the kill": [_killed_run(client={**client,
                                                                                  "micro_served_after_kill": 0})],
             "no answer cut off": [_killed_run(client={**client, "cut_off": cut["cut_off"]})]}
    assert cut["cut_off"] == 2  # a stream without [DONE] nor an error event, and no HTTP answer at all
    for prefix, runs in cases.items():
        for run in runs:
            failed = _failed(run)
            assert len(failed) == 1 and failed[0].startswith(prefix), (prefix, failed)
