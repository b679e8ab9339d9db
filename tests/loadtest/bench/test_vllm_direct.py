"""The pinned-vs-direct bench's table: medians over rounds per target and concurrency, ratios against direct; and each
relay paired with direct round by round against issue 55's item 4 targets."""

from __future__ import annotations

from loadtest.bench.vllm_direct import _paired, _summary


def _cell(rnd: int, target: str, req_s: float, p50: float, p99: float, cpu: float = 0.0) -> dict[str, object]:
    return {"round": rnd, "target": target, "concurrency": 8, "req_s": req_s, "ttft_p50_ms": p50,
            "ttft_p99_ms": p99, "relay_cpu_ms_per_req": cpu}


def test_the_table_compares_each_targets_medians_with_direct() -> None:
    cells = [_cell(0, "direct", 10.0, 20.0, 100.0), _cell(1, "direct", 30.0, 40.0, 300.0),
             _cell(0, "gateway", 9.0, 25.0, 130.0, 1.0), _cell(1, "gateway", 19.0, 35.0, 270.0, 3.0)]
    rows = _summary(cells, ["direct", "gateway"])
    assert rows[2] == "| 8 | direct | 20.00 | 1.000 | 30.0 | +0.0 | 200.0 | 1.00 | 0.00 |"
    # medians 14 req/s, 30 ms, 200 ms, 2 ms of relay CPU: 0.7 of direct's rate, TTFT p50 +0, p99 1.0x
    assert rows[3] == "| 8 | gateway | 14.00 | 0.700 | 30.0 | +0.0 | 200.0 | 1.00 | 2.00 |"


def test_each_round_is_paired_with_direct_in_that_round_and_the_rounds_meeting_each_target_are_counted() -> None:
    cells = [_cell(0, "direct", 10.0, 20.0, 100.0), _cell(1, "direct", 30.0, 40.0, 300.0),
             _cell(0, "gateway", 9.0, 27.0, 120.0), _cell(1, "gateway", 30.0, 41.0, 450.0)]
    rows = _paired(cells, ["direct", "gateway"])
    assert rows[0].startswith("paired with direct in the same round")
    # round 0: 0.9 of direct's rate, +7 ms, 1.2x; round 1: 1.0, +1 ms, 1.5x (the ratio of medians would say 0.975)
    assert rows[1:] == [
        "  c=8 gateway rate x direct: 0.900, 1.000 (median 0.950; at least 0.95: 1 of 2 rounds)",
        "  c=8 gateway TTFT p50 - direct ms: +7.0, +1.0 (median +4.0; at most +5: 1 of 2 rounds)",
        "  c=8 gateway TTFT p99 x direct: 1.20, 1.50 (median 1.35; at most 1.3: 1 of 2 rounds)",
    ]


def test_a_cell_that_completed_nothing_leaves_the_tables_printable_and_meets_no_target() -> None:
    cells = [_cell(0, "direct", 0.0, 20.0, 0.0), _cell(0, "gateway", 9.0, 27.0, 120.0)]
    targets = ["direct", "gateway"]
    assert _summary(cells, targets)[3] == "| 8 | gateway | 9.00 | nan | 27.0 | +7.0 | 120.0 | nan | 0.00 |"
    assert _paired(cells, targets)[1] == "  c=8 gateway rate x direct: nan (median nan; at least 0.95: 0 of 1 rounds)"
