"""The overhead benchmark's `--workers` option: parsing and the 1-vs-N scaling rows."""

from __future__ import annotations

from loadtest.bench.overhead import build_parser, worker_scaling


def test_workers_option_parses_a_list() -> None:
    assert build_parser().parse_args(["--workers", "1,2"]).workers == [1, 2]
    assert build_parser().parse_args([]).workers == [1]


def test_worker_scaling_divides_by_the_one_worker_row_of_the_same_transport_and_concurrency() -> None:
    rows = [
        {"target": "direct", "concurrency": 16, "rps": 5000.0},
        {"target": "gw-aiohttp", "concurrency": 16, "rps": 1000.0},
        {"target": "gw-aiohttp-w2", "concurrency": 16, "rps": 1500.0},
        {"target": "gw-aiohttp", "concurrency": 64, "rps": 800.0},
        {"target": "gw-aiohttp-w2", "concurrency": 64, "rps": 400.0},
    ]
    got = {(r["concurrency"], r["workers"]): r["ratio"] for r in worker_scaling(rows)}
    assert got == {(16, 2): 1.5, (64, 2): 0.5}
