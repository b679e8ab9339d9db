"""The scorer benchmark's parts: the timing prompt mix, the target verdicts, knob parsing, and a code-variant
worker driven over its pipe (a stand-in tree with a fake `load_scorer`, so no model is loaded)."""

from __future__ import annotations

import asyncio
import gzip
import json
import statistics
import time
from pathlib import Path

import pytest

from loadtest.bench.offered_load import fine_timer_loop
from loadtest.bench.scorer import Result, parse_variants, verdicts
from loadtest.bench.scorer_prompts import REAL_SOURCES, timing_prompts
from loadtest.bench.scorer_variants import TreeWorker


def _write_source(root: Path, prompts: list[str]) -> None:
    path = root / REAL_SOURCES[0]
    path.parent.mkdir(parents=True)
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.writelines(json.dumps({"prompt": p, "label": "ignored"}) + "\n" for p in prompts)


def test_prompts_are_unique_and_mix_real_with_short_chat(tmp_path: Path) -> None:
    real = [f"Question {i}: " + "which of the following is a long exam question? " * 8 for i in range(50)]
    _write_source(tmp_path, real)
    got = timing_prompts(400, seed=3, data_dir=tmp_path)
    assert len(got.prompts) == 400 and len(set(got.prompts)) == 400
    assert "real prompts" in got.source
    taken = [p for p in got.prompts if p.startswith("Question")]
    assert 120 < len(taken) < 280  # about half, and the 50 real ones recur only tagged as new requests
    assert set(real) <= set(taken)
    short = [len(p.split()) for p in got.prompts if not p.startswith("Question")]
    assert statistics.median(short) < 20
    assert max(len(p) for p in got.prompts) <= 2000
    assert timing_prompts(400, seed=3, data_dir=tmp_path).prompts == got.prompts  # reproducible


def test_prompts_fall_back_without_the_data_folder(tmp_path: Path) -> None:
    got = timing_prompts(300, seed=1, data_dir=tmp_path / "absent")
    assert "absent" in got.source
    assert len(set(got.prompts)) == 300
    lengths = sorted(len(p) for p in got.prompts)
    assert lengths[len(lengths) // 2] < 120 < lengths[-1]  # mostly short, some long


def _cell(rate: float, throughput: float, p99: float, cpu_ms: float = 4.0) -> Result:
    return Result(rate, int(throughput * 10), throughput, p99 / 3, p99, 0, cpu_ms)


def test_verdicts_apply_the_targets_to_medians() -> None:
    good = {100.0: [_cell(100, 100, 5), _cell(100, 100, 40), _cell(100, 100, 8)],
            1000.0: [_cell(1000, 999, 50, 0.8)] * 3}
    assert [ok for _, ok in verdicts(good)] == [True, True, True]
    runaway = {100.0: [_cell(100, 100, 25)] * 3, 1000.0: [_cell(1000, 700, 900, 2.0)] * 3}
    assert [ok for _, ok in verdicts(runaway)] == [False, False, False]
    assert [ok for _, ok in verdicts({50.0: [_cell(50, 50, 5)]})] == [None, None, None]


def test_variants_parse_and_reject_unknown_knobs() -> None:
    assert parse_variants("workers=1,threads=2;max_wait_ms=0") == [{"workers": 1.0, "threads": 2.0},
                                                                   {"max_wait_ms": 0.0}]
    with pytest.raises(ValueError, match="colour"):
        parse_variants("colour=3")
    with pytest.raises(ValueError, match="bad value"):
        parse_variants("workers=two")


FAKE_SERVING = '''
import asyncio
from collections import deque


class FakeScorer:
    def __init__(self):
        self.batch_sizes = deque()

    async def score(self, texts):
        self.batch_sizes.append(len(texts))
        await asyncio.sleep(0.001)
        return [0.5 for _ in texts]

    async def aclose(self):
        return None


def load_scorer(artifact=None):
    print("chatter on stdout from a library")
    return FakeScorer()
'''


def test_a_tree_worker_scores_with_its_own_tree(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "router_models").mkdir(parents=True)
    (tree / "router_models" / "__init__.py").write_text("")
    (tree / "router_models" / "serving.py").write_text(FAKE_SERVING)
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps([f"p{i}" for i in range(10)]))
    worker = TreeWorker(str(tree), prompts, None)
    try:
        assert worker.origin == str((tree / "router_models").resolve())
        reply = worker.run(200.0, 0.5, 0.0, 7)
    finally:
        worker.close()
    assert reply["errors"] == 0 and 50 < int(str(reply["completed"])) < 160  # Poisson(100), more than 10 prompts
    assert str(reply["stats"]).startswith("batches=")


def test_trees_take_one_artifact_for_all_or_one_each() -> None:
    import argparse

    from loadtest.bench.scorer import _tree_artifacts

    def pairs(trees: str, artifacts: str | None) -> list[tuple[str, str | None]]:
        return _tree_artifacts(argparse.Namespace(trees=trees, artifacts=artifacts))

    assert pairs("old,.", None) == [("old", None), (".", None)]
    assert pairs("old,.", "a.json") == [("old", "a.json"), (".", "a.json")]
    assert pairs("old,.", "a.json,b.json") == [("old", "a.json"), (".", "b.json")]
    with pytest.raises(SystemExit, match="one per tree"):
        pairs("old,.", "a.json,b.json,c.json")


def _median_lateness_ms(loop: asyncio.AbstractEventLoop, sleep_s: float = 0.0003, times: int = 21) -> float:
    async def late() -> list[float]:
        out = []
        for _ in range(times):
            started = time.perf_counter()
            await asyncio.sleep(sleep_s)
            out.append((time.perf_counter() - started - sleep_s) * 1000)
        return out

    try:
        return statistics.median(loop.run_until_complete(late()))
    finally:
        loop.close()


def test_arrivals_fire_on_time_where_the_default_loop_rounds_up_to_a_millisecond() -> None:
    # epoll's timeout is whole milliseconds, rounded up: a 0.3 ms wait takes at least 1 ms, and the generator's
    # lateness would count in every latency the bench reports
    assert _median_lateness_ms(asyncio.new_event_loop()) >= 0.6
    assert _median_lateness_ms(fine_timer_loop()) < 0.5


def test_tiers_place_the_three_pool_example_and_rate_every_scored_request(monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    from loadtest.bench import scorer_memory
    from router_models.serving import pool_map as pool_map_module

    class FakeScorer:
        pool_map = pool_map_module.load_pool_map()

        async def score_one(self, text: str) -> tuple[float, str]:
            return (0.4, "primary") if text != "overflow" else (0.6, "overflow")

        def features(self, text: str) -> np.ndarray:
            return np.zeros(self.pool_map.dim, np.float32)

    scorer = FakeScorer()
    assert scorer_memory.tier_placements(scorer, 0) is None
    assert scorer_memory.tier_placements(object(), 3) is None  # an older tree's scorer: no map, measured without
    for tiers in range(1, 6):
        mapped = scorer_memory.tier_placements(scorer, tiers)
        assert mapped is not None and len(mapped[1]) == tiers
    rated: list[tuple[int, int]] = []
    real_quality = pool_map_module.quality

    def counting(pool_map: object, rows: np.ndarray, placements: list[object]) -> np.ndarray:
        out = real_quality(pool_map, rows, placements)  # type: ignore[arg-type]
        rated.append(out.shape)
        return out

    monkeypatch.setattr(pool_map_module, "quality", counting)
    score_one = scorer_memory.with_memory(scorer, None, 3)

    async def both() -> list[float]:
        return [await score_one("a prompt"), await score_one("overflow")]

    assert asyncio.run(both()) == [0.4, 0.6]  # the overflow model keeps no row: nothing to rate
    assert rated == [(1, 3)]
