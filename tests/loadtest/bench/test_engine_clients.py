"""The engine-client benchmark runs both transports against the fake engine and reports their ratios."""

from __future__ import annotations

import json

import pytest

from loadtest.bench.engine_clients import main


def test_a_short_run_reports_each_cell_for_both_transports(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--rounds", "2", "--requests", "40", "--streams", "8", "--concurrency", "4"])
    results = json.loads(capsys.readouterr().out)
    assert len(results) == 3
    for cell in results.values():
        assert set(cell["median"]) == {"h1", "aiohttp"}
        assert all(m["cpu_us_per_request"] > 0 and m["requests_per_s"] > 0 for m in cell["median"].values())
        assert cell["cpu_per_request_ratio"] > 0 and len(cell["cpu_us_per_request_by_round"]["h1"]) == 2


def test_it_compares_exactly_two_known_transports() -> None:
    with pytest.raises(SystemExit):
        main(["--transports", "h1"])
    with pytest.raises(SystemExit):
        main(["--transports", "h1,httpx"])
