"""The learning curve's bookkeeping on a small synthetic matrix (it tests the code, never the router's quality):
seeded draws, N capped by the source's size, own rows in label form, and a curve that rises when the user's
rows carry a signal the public sources lack."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import numpy.typing as npt
import pytest

from loadtest.studies.learning_curve_fits import (
    OWN_ONLY,
    CurvePoint,
    as_own,
    learning_curve,
    methods,
    sizes_for,
    summary,
)
from router_models.serving.label_memory import MemoryParams
from router_models.training.outcomes import Example
from router_models.training.targets import targets
from router_models.training.trainer import TrainConfig

CFG = TrainConfig(target="pairwise")


def _matrix() -> tuple[npt.NDArray[np.float32], list[Example]]:
    """Two public sources whose event is noise, one (gsm8k) whose event follows feature 0."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=(1300, 5)).astype(np.float32)
    rows = []
    for i in range(1300):
        source = ("routellm-mmlu", "routerbench", "routellm-gsm8k")[min(i // 400, 2)]
        signal = x[i, 0] if source == "routellm-gsm8k" else rng.normal()
        weak = float(1.0 / (1.0 + np.exp(2.0 * signal)))
        rows.append(Example(f"q{i}", source, "g", weak, 1.0, f"k{i}", models=("a", "b"), outcomes=(1.0, 0.0)))
    return x, rows


def test_sizes_keep_a_test_rest() -> None:
    assert sizes_for(1307) == (0, 100, 300, 1000)
    assert sizes_for(13932) == (0, 100, 300, 1000, 3000)
    assert sizes_for(350, min_rest=300) == (0,)


def test_own_rows_carry_only_the_observed_event() -> None:
    _, rows = _matrix()
    own = as_own(rows[:3])
    assert {ex.source for ex in own} == {"labels:own"}
    assert all(ex.models == () and ex.outcomes == () for ex in own)
    assert targets(own, "irt-fail") == pytest.approx([ex.target for ex in rows[:3]])


def test_curve_is_deterministic_and_rises_on_a_learnable_source() -> None:
    x, rows = _matrix()
    compared = methods(CFG, ks=(100,), penalties=(10,))

    def run() -> list[CurvePoint]:
        return learning_curve(x, rows, CFG, compared, sources=["routellm-gsm8k"], sizes=(0, 100, 300), draws=2,
                              min_rest=250)

    points = run()
    assert points == run()
    assert {p.n for p in points} == {0, 100}  # 300 would leave 200 < 250 rows: capped
    assert len(points) == len(compared) * 2 * 2
    assert {p.test for p in points} == {500 - 100}
    table = summary(points)
    for name in ("share k=100", "correction penalty=10", OWN_ONLY):
        assert table[name]["routellm-gsm8k"][0] < 0.6  # the public sources teach nothing here
        assert table[name]["routellm-gsm8k"][100] > 0.65  # 100 own labels do


def test_summary_means_over_the_sources_that_have_the_n() -> None:
    points = [CurvePoint("a", "m", 0, 0, 0.5, 10), CurvePoint("a", "m", 0, 1, 0.7, 10),
              CurvePoint("b", "m", 0, 0, 0.4, 10), CurvePoint("b", "m", 100, 0, 0.8, 10)]
    table = summary(points)["m"]
    assert table["a"] == {0: pytest.approx(0.6)}
    assert table["mean"] == {0: pytest.approx(0.5), 100: pytest.approx(0.8)}


def test_methods_name_every_mode() -> None:
    names = methods(replace(CFG), ks=(1000,), penalties=(100,))
    assert {m.own_labels for m in names.values()} == {"equal", "share", "correction"}
    assert names["share k=1000"].own_k == 1000.0 and names["correction penalty=100"].own_penalty == 100.0


def test_the_label_memory_learns_a_learnable_source_beside_the_public_router() -> None:
    x, rows = _matrix()
    cfg = CFG
    compared = methods(cfg, ks=(), penalties=(), own_only=False, memories=(MemoryParams(),))
    (name,) = [n for n in compared if n.startswith("memory")]
    points = learning_curve(x, rows, cfg, compared, sources=["routellm-gsm8k"], sizes=(0, 100), draws=2,
                            min_rest=250)
    table = summary(points)[name]["routellm-gsm8k"]
    assert table[0] < 0.6 and table[100] > 0.65
