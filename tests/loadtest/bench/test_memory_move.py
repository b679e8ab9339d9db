"""The label-memory move benchmark measures moves of this checkout's code (`loadtest.bench.memory_move`): each size
gives a warm and a cold CPU figure per move. Rows here are random, of the fast artifact's width; timing only."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from loadtest.bench.memory_move import _measure
from router_models.serving.artifact import load_artifact

ROOT = Path(__file__).resolve().parents[3]


def test_each_memory_size_gives_a_warm_and_a_cold_cpu_figure_per_move(tmp_path: Path) -> None:
    dim = load_artifact(ROOT / "router_models/artifacts/complexity-router-static.json").router.dim
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(160, dim)).astype(np.float32)
    path = tmp_path / "rows.npz"
    np.savez(path, labels=rows[:120], targets=rng.uniform(size=120), requests=rows[120:],
             scores=rng.uniform(0.05, 0.95, size=40), dims=384)
    result = _measure(str(ROOT), path, [50, 120], moves=40)
    assert set(result["moves"]) == {"50", "120"}
    for warm, cold in result["moves"].values():
        assert warm > 0 and cold > 0
