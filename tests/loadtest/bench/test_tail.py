"""The tail benchmark reads the collector's pauses and the loop lag from a gateway's real metrics text, and its
summary gives p99/p50 per cell."""

from __future__ import annotations

import gc
import re

from gateway.telemetry.gc_pauses import GcPauses
from gateway.telemetry.metrics import GatewayMetrics
from loadtest.bench.tail import build_parser, distinct_share, gc_counts, summarise


def test_gc_counts_reads_a_gateways_metrics() -> None:
    metrics = GatewayMetrics(lambda: {})
    pauses = GcPauses(metrics.gc.paused)
    pauses.install()
    try:
        gc.collect(2)
        gc.collect(0)
    finally:
        pauses.uninstall()
    metrics.gc.paused(1, 0.05, 3)  # one collection over 10 ms, freeing 3 objects of reference cycles
    for lag in (0.001, 0.2):
        metrics.loop_lag.observe(lag)
    counts = gc_counts(metrics.render().decode())
    assert counts["gen2_count"] == 1 and counts["gen0_count"] == 1 and counts["gen1_count"] == 1
    assert counts["gen1_over_10ms"] == 1 and counts["gen1_sum"] >= 0.05
    assert counts["lag_count"] == 2 and counts["lag_over"] == 1 and counts["cycles"] >= 3


def test_summary_takes_medians_and_the_tail_ratio_per_cell() -> None:
    cells = [{"target": "freeze/json", "concurrency": 16, "rps": rps, "p50_ms": 10.0, "p99_ms": p99,
              "server_cpu_ms_per_req": 0.5, "non2xx": 0, "socket_errors": 0, "gc": {"gen2_count": 1.0},
              "requests": 10}
             for rps, p99 in ((100.0, 20.0), (300.0, 40.0), (200.0, 90.0))]
    (row,) = summarise(cells)
    assert row["rps"] == 200.0 and row["p99_ms"] == 40.0 and row["tail"] == 4.0 and row["gc"]["gen2_count"] == 3.0
    assert row["requests"] == 30


def test_defaults_match_the_saturation_setup() -> None:
    args = build_parser().parse_args([])
    assert args.scorer == "classifier" and args.concurrency == [16, 64] and args.bodies == ["json", "stream"]
    assert args.variants == ["freeze", "nofreeze"]


def test_the_distinct_script_sends_a_different_valid_prompt_each_time() -> None:
    import orjson

    from loadtest.bench.wrk import distinct_lua

    prompts = ['say "hi"\nplease', "x" * 50, "Ünï ]==] code {}"]
    script = distinct_lua(prompts, {"model": "auto", "max_tokens": 16})
    pieces = re.findall(r"\{\[(=+)\[(.*?)\]\1\], \[\1\[(.*?)\]\1\]\}", script, re.DOTALL)
    assert len(pieces) == 3
    bodies = [orjson.loads(front + str(n) + back) for n, (_, front, back) in enumerate(pieces * 2)]
    contents = [b["messages"][0]["content"] for b in bodies]
    assert len(set(contents)) == 6 and contents[0] == '#0 say "hi"\nplease' and bodies[0]["model"] == "auto"
    assert contents[4] == "#4 " + "x" * 50  # the number leads: a prompt cut at the scorer's length keeps it
    # each run numbers on from its start second x 100,000 (a rerun of the script repeats no number), printed whole
    assert "local n = (os.time() % 100000) * 100000" in script and "string.format('%d', n)" in script


def test_the_distinct_share_is_given_from_the_medians_and_round_by_round() -> None:
    def cell(rnd: int, target: str, rps: float) -> dict[str, object]:
        return {"round": rnd, "target": target, "concurrency": 16, "rps": rps}

    cells = [cell(1, "freeze/distinct", 600.0), cell(1, "freeze/pinned", 1000.0), cell(2, "freeze/distinct", 900.0),
             cell(2, "freeze/pinned", 2000.0), cell(1, "direct/distinct", 9000.0), cell(1, "direct/pinned", 9000.0)]
    rows = [{"target": "freeze/distinct", "concurrency": 16, "rps": 750.0},
            {"target": "freeze/pinned", "concurrency": 16, "rps": 1500.0},
            {"target": "direct/distinct", "concurrency": 16, "rps": 9000.0}]
    # medians 750 / 1,500 = 0.50; the rounds 0.60 and 0.45: the drift between rounds is what the pairing shows
    assert distinct_share(rows, cells) == [
        "c=16 freeze: routed with distinct prompts 750 req/s = 0.50 of pinned (1500 req/s); round by round 0.60, 0.45 "
        "(1 of 2 rounds at 0.5 or more)"]
