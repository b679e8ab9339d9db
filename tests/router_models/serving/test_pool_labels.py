"""Labels per pool: a label of pool X moves X's predicted quality near its prompt and no other pool's, a two-pool
label labels a tiers policy's first and last tier, labels that name pools only leave the two-pool score exactly as
it was, and the memory file keeps them (format 2; a memory without them is still written as format 1).

Vectors here are made up to test the arithmetic, never what labels buy."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from router_models.serving.classifier import LinearRouter
from router_models.serving.label_memory import LabelMemory, MemoryParams, MemoryRouter
from router_models.serving.memory_file import load_memory, save_memory
from router_models.serving.pool_labels import FLAGSHIP, MICRO, PoolLabels

EMBED, EXTRA = 8, 2
TIERS = ("general", "code", "flagship")
PARAMS = MemoryParams(neighbours=5, bandwidth=0.05, prior=1.0, early_labels=0)
NAN = float("nan")


def _rows(*axes: int) -> npt.NDArray[np.float32]:
    """Rows whose embeddings are unit vectors along `axes` (orthogonal ones: weight exp(-1 / 0.05), none)."""
    x = np.zeros((len(axes), EMBED + EXTRA), np.float32)
    for i, axis in enumerate(axes):
        x[i, axis] = 1.0
    return x


def _memory(rows: npt.NDArray[np.float32], targets: list[float], pools: tuple[str, ...],
            qualities: list[list[float]]) -> LabelMemory:
    return LabelMemory(rows, np.asarray(targets, np.float64), EMBED, PARAMS, (), pools,
                       np.asarray(qualities, np.float64))


def test_a_label_of_one_pool_moves_that_pool_alone_and_only_near_its_prompt() -> None:
    # pool "code" answered the prompt along axis 0 badly, "general" the one along axis 1 well
    memory = _memory(_rows(0, 1), [NAN, NAN], ("code", "general"), [[0.0, NAN], [NAN, 1.0]])
    labels = PoolLabels.of(memory)
    assert labels is not None and len(labels) == 2
    tiers = labels.on(TIERS, np.full((2, 3), 0.6))
    assert tiers.counts() == (1, 1, 0)
    moves = tiers.moves(_rows(0, 1, 2))
    assert moves[0, 1] < -0.2 and moves[0, 0] == pytest.approx(0.0, abs=1e-6)  # near the code label: code falls
    assert moves[1, 0] > 0.1 and moves[1, 1] == pytest.approx(0.0, abs=1e-6)  # near the general label: it rises
    assert np.all(moves[:, 2] == 0.0)  # no flagship label: no move at all
    assert np.abs(moves[2]).max() < 1e-6  # a request near no label keeps every prediction


def test_labels_move_against_the_prediction_they_correct() -> None:
    memory = _memory(_rows(0), [NAN], ("code",), [[0.6]])
    labels = PoolLabels.of(memory)
    assert labels is not None
    right = labels.on(TIERS, np.full((1, 3), 0.6)).moves(_rows(0))
    wrong = labels.on(TIERS, np.full((1, 3), 0.9)).moves(_rows(0))
    assert right[0, 1] == pytest.approx(0.0, abs=1e-9)  # the placement was right there: nothing to correct
    assert wrong[0, 1] < -0.1


def test_a_two_pool_label_labels_the_first_and_last_tier_and_a_pools_own_label_comes_first() -> None:
    memory = _memory(_rows(0, 0), [0.5, NAN], (MICRO, FLAGSHIP, "general"), [[0.0, 1.0, NAN], [NAN, NAN, 0.9]])
    labels = PoolLabels.of(memory)
    assert labels is not None
    columns = labels.columns(TIERS)
    assert columns[0].tolist() == [0.0, pytest.approx(NAN, nan_ok=True), 1.0]
    assert columns[1, 0] == 0.9 and np.isnan(columns[1, 1:]).all()  # "general" named: its own column
    both = _memory(_rows(0), [0.5], (MICRO, "general"), [[0.0, 0.8]])
    assert PoolLabels.of(both) is not None and PoolLabels.of(both).columns(TIERS)[0, 0] == 0.8  # type: ignore[union-attr]
    two = labels.columns(("micro", "flagship"))  # a two-tier policy: its pools are the ends
    assert two[0].tolist() == [0.0, 1.0]


def test_labels_that_name_pools_only_leave_the_two_pool_score_exactly_as_it_was() -> None:
    rng = np.random.default_rng(3)
    router = LinearRouter(weights=rng.normal(scale=0.3, size=EMBED + EXTRA).astype(np.float32), bias=-1.0)
    gap_rows = np.hstack([rng.normal(size=(6, EMBED)), rng.normal(size=(6, EXTRA))]).astype(np.float32)
    gap_rows[:, :EMBED] /= np.linalg.norm(gap_rows[:, :EMBED], axis=1, keepdims=True)
    targets = [1.0, 0.5, 0.75, 1.0, 0.5, 0.9]
    plain = LabelMemory(gap_rows, np.asarray(targets), EMBED, PARAMS)
    extra = _rows(0, 1)
    mixed = LabelMemory(np.vstack([gap_rows, extra]), np.asarray([*targets, NAN, NAN]), EMBED, PARAMS, (),
                        ("code",), np.asarray([[NAN]] * 6 + [[0.0], [1.0]]))
    queries = np.vstack([gap_rows, extra, _rows(2)])
    assert np.array_equal(MemoryRouter.attach(router, mixed).predict_proba(queries),
                          MemoryRouter.attach(router, plain).predict_proba(queries))
    assert PoolLabels.of(plain) is None  # no labels per pool: a tiers trade shifts by the score's gap move


def test_a_label_must_give_a_target_or_a_quality_in_the_unit_interval() -> None:
    with pytest.raises(ValueError, match="target or a quality"):
        _memory(_rows(0), [NAN], ("code",), [[NAN]])
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        _memory(_rows(0), [NAN], ("code",), [[1.5]])
    with pytest.raises(ValueError, match="target or a quality"):
        LabelMemory(_rows(0), np.asarray([NAN]), EMBED)


def test_labels_per_pool_grow_and_survive_the_file(tmp_path: Path) -> None:
    memory = LabelMemory.empty(EMBED + EXTRA, EMBED, PARAMS).extended(_rows(0), [0.5], ["a"],
                                                                      [{MICRO: 1.0, FLAGSHIP: 1.0}])
    grown = memory.extended(_rows(1, 2), [NAN, NAN], ["b", "c"], [{"code": 0.0}, {"general": 0.3, "code": 1.0}])
    assert grown.pools == (MICRO, FLAGSHIP, "code", "general")
    assert grown.gap_labels().targets.tolist() == [0.5] and grown.gap_labels().keys == ("a",)
    meta = save_memory(grown, tmp_path / "m.json", embedder="e")
    loaded, header = load_memory(meta, embedder="e")
    assert header["memory_format"] == 2 and header["pools"] == list(grown.pools)
    assert loaded.pools == grown.pools and loaded.qualities is not None and grown.qualities is not None
    assert np.array_equal(np.isnan(loaded.qualities), np.isnan(grown.qualities))
    assert np.array_equal(np.nan_to_num(loaded.qualities), np.nan_to_num(grown.qualities))
    plain = save_memory(LabelMemory(_rows(0), np.asarray([0.5]), EMBED), tmp_path / "p.json", embedder="e")
    header = json.loads(plain.read_text())
    assert header["memory_format"] == 1 and "pools" not in header  # readable by a gateway without labels per pool
    assert load_memory(plain)[0].qualities is None
