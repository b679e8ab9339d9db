"""The response-cache benchmarks' own arithmetic: false-hit rates per threshold, and the wrk scripts' prompts."""

from __future__ import annotations

import numpy as np

from gateway.caching.vectors import quantise
from loadtest.bench.overhead_cache import cache_lua
from loadtest.studies.cache_similarity import THRESHOLDS, false_hits


def test_false_hit_rates_count_prompts_whose_nearest_other_prompt_reaches_the_threshold() -> None:
    base = np.zeros(8)
    base[0] = 1.0
    twin = base.copy()
    twin[1] = 0.1  # cosine ~0.995 to base
    apart = np.zeros(8)
    apart[2] = 1.0
    q = np.vstack([quantise(v) for v in (base, twin, apart)])
    found = false_hits(q, ["s1", "s1", "s2"])
    at = {r["threshold"]: r for r in found["rates"]}
    assert set(at) == set(THRESHOLDS)
    assert at[0.99]["prompts_with_a_false_hit"] == 2 / 3  # the twins find each other, the third nothing
    assert at[0.99]["per_source"] == {"s1": 1.0, "s2": 0.0}
    assert at[0.99]["pairs_over"] == 1 / 3
    assert found["best"][2] < 0.01


def test_the_wrk_scripts_send_unique_or_cycling_deterministic_prompts() -> None:
    unique, cycling = cache_lua("sk-a", True, 16), cache_lua("sk-b", False, 16)
    assert "Bearer sk-a" in unique and 'string.format("%d-%d", seed, n)' in unique
    assert "tostring(n % 256)" in cycling and "seed, n" not in cycling
    assert all('"temperature": 0' in s and '"max_tokens": 16' in s for s in (unique, cycling))
