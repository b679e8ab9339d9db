"""The batch study's pooled figures (`loadtest.studies.batch_priority.pooled`), on samples made here: the p99's ratio
to the load alone's and its bootstrap interval. The study itself runs real engines for minutes (BENCHMARKS.md
"Batches beside interactive load")."""

from __future__ import annotations

import random

import pytest

from loadtest.studies.batch_priority import pooled


def test_pooled_figures_give_the_p99_ratio_and_an_interval_around_it() -> None:
    rng = random.Random(3)
    alone = [rng.expovariate(50) for _ in range(1000)]
    rows = {row["pooled"]: row for row in pooled({"alone": alone, "batch alone": [],
                                                  "beside": [t * 1.5 for t in alone], "same": list(alone)})}
    assert set(rows) == {"alone", "beside", "same"}  # a phase without interactive requests has no row
    assert "p99_vs_alone" not in rows["alone"] and rows["alone"]["requests"] == 1000
    assert rows["beside"]["p99_vs_alone"] == pytest.approx(1.5) and rows["same"]["p99_vs_alone"] == 1.0
    assert rows["beside"]["p50_ms"] == pytest.approx(1.5 * rows["alone"]["p50_ms"])
    for name, ratio in (("beside", 1.5), ("same", 1.0)):
        low, high = rows[name]["ratio_90pct"]
        assert low < ratio < high  # resampled independently: the interval is wide even for the same samples
    # seeded: the same samples give the same interval
    assert pooled({"alone": alone, "beside": alone[::-1]}) == pooled({"alone": alone, "beside": alone[::-1]})
