"""The speculative-decoding benchmark's arithmetic: medians over rounds, spec / plain ratios, the table; and a
stream's time per output token (its mix runs need real engines: `python -m loadtest.bench.speculative`)."""

from __future__ import annotations

import pytest

from loadtest.bench.speculative import MIXES, MixResult, _Sample, summarise, table


def _result(tokens_per_s: float, acceptance: float | None = None) -> MixResult:
    return MixResult(tokens_per_s=tokens_per_s, itl_p50_ms=2.0, itl_p99_ms=10.0, tpot_p50_ms=3.0,
                     ttft_p50_ms=40.0, acceptance=acceptance, errors=0)


def test_medians_and_ratios_per_mix() -> None:
    results = {"spec": {m.name: [_result(100, 0.5), _result(300, 0.7), _result(200, 0.6)] for m in MIXES},
               "plain": {m.name: [_result(400), _result(100), _result(250)] for m in MIXES}}
    summary = summarise(results)
    echo = summary["echo"]
    assert echo["median"]["spec"]["tokens_per_s"] == 200 and echo["median"]["plain"]["tokens_per_s"] == 250
    assert echo["ratio_spec_over_plain"]["tokens_per_s"] == pytest.approx(0.8)
    assert echo["median"]["spec"]["acceptance"] == pytest.approx(0.6) and echo["median"]["plain"]["acceptance"] is None
    assert "| echo | 250.0 / 200.0 (0.80) |" in table(summary) and "| 0.600 |" in table(summary)


def test_time_per_output_token_ignores_how_tokens_were_grouped_into_events() -> None:
    assert _Sample(tokens=5, gaps_s=[0.0, 0.04]).tpot_s == pytest.approx(0.01)  # 4 tokens after the first in 40 ms
    assert _Sample(tokens=1).tpot_s is None
