"""The label memory: labels move the scores of prompts near them and of no others, a label counts as soon as it is
added (the same result as a memory built with it), and its file is verified like the router artifact.

Vectors here are made up to test the arithmetic, never the router's quality (that is the learning curve's,
on real outcomes: MODEL_CARD.md)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from router_models.serving.artifact import ArtifactError
from router_models.serving.classifier import LinearRouter, SourceRouters
from router_models.serving.label_memory import (
    LabelMemory,
    MemoryParams,
    MemoryRouter,
    fit_combination,
    fit_scale,
    reading_scale,
)
from router_models.serving.memory_file import load_memory, memory_paths, save_memory

EMBED, EXTRA = 8, 2  # an embedding of 8 numbers, then 2 structural columns
# float32 rows and a float32 similarity product: results agree with the exact arithmetic to ~1e-6
WITHIN = 1e-5


def _unit(rng: np.random.Generator, n: int) -> npt.NDArray[np.float32]:
    v = rng.normal(size=(n, EMBED))
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return np.hstack([v, rng.normal(size=(n, EXTRA))]).astype(np.float32)


def _router(rng: np.random.Generator) -> LinearRouter:
    return LinearRouter(weights=rng.normal(scale=0.3, size=EMBED + EXTRA).astype(np.float32), bias=-1.0)


def test_an_empty_memory_keeps_the_routers_scores() -> None:
    rng = np.random.default_rng(0)
    router, x = _router(rng), _unit(rng, 5)
    attached = MemoryRouter.attach(router, LabelMemory.empty(EMBED + EXTRA, EMBED))
    assert np.array_equal(attached.predict_proba(x), router.predict_proba(x))


def test_labels_move_the_prompts_near_them_and_not_distant_ones() -> None:
    rng = np.random.default_rng(1)
    router = _router(rng)
    high, low, far = _unit(rng, 3)[:, None, :]
    high[0, :EMBED], low[0, :EMBED], far[0, :EMBED] = np.eye(EMBED)[:3]  # orthogonal: weight exp(-1 / 0.05), none
    params = MemoryParams(neighbours=5, bandwidth=0.05, prior=1.0)
    # `high` needed the flagship (target 1), `low` did not (target 0.5: no gap)
    attached = MemoryRouter.attach(router, LabelMemory(np.vstack([high, low]), np.asarray([1.0, 0.5]), EMBED,
                                                       params))
    assert attached.predict_proba(high)[0] > router.predict_proba(high)[0] + 0.01
    assert attached.predict_proba(low)[0] < router.predict_proba(low)[0] - 0.01
    assert float(attached.predict_proba(far)[0]) == pytest.approx(float(router.predict_proba(far)[0]), abs=WITHIN)


def test_with_no_residual_the_routers_score_comes_back() -> None:
    """Labels that agree with the (level-shifted) router, read at the slope fitted, move nothing: the shift is
    undone exactly."""
    rng = np.random.default_rng(8)
    router, x, queries = _router(rng), _unit(rng, 6), _unit(rng, 4)
    logits = x.astype(np.float64) @ router.weights.astype(np.float64) + router.bias
    targets = 1.0 / (1.0 + np.exp(-(logits + 0.7)))  # the router's scores, one level up
    attached = MemoryRouter.attach(router, LabelMemory(x, targets, EMBED, MemoryParams(slope_scale=1.0)))
    assert attached.level == pytest.approx(0.7, abs=1e-6)
    np.testing.assert_allclose(attached.predict_proba(queries), router.predict_proba(queries), atol=WITHIN)


def test_many_close_labels_that_agree_move_a_score_further_than_few() -> None:
    rng = np.random.default_rng(2)
    router, query, other = _router(rng), _unit(rng, 1), _unit(rng, 20)
    near = np.repeat(query, 20, axis=0)
    near[:, :EMBED] += rng.normal(scale=0.02, size=(20, EMBED)).astype(np.float32)
    base = float(router.predict_proba(query)[0])

    def moved(count: int) -> float:
        rows = np.vstack([near[:count], other])  # `other` (no gap) sets the level; `near` needed the flagship
        targets = np.concatenate([np.ones(count), np.full(20, 0.5)])
        memory = LabelMemory(rows, targets, EMBED, MemoryParams(neighbours=30))
        return float(MemoryRouter.attach(router, memory).predict_proba(query)[0])

    assert base < moved(1) < moved(20) <= 1.0


def test_labels_added_one_by_one_score_as_a_memory_built_with_them() -> None:
    rng = np.random.default_rng(3)
    router, labelled, queries = _router(rng), _unit(rng, 40), _unit(rng, 30)
    targets = rng.uniform(size=40)
    whole = MemoryRouter.attach(router, LabelMemory(labelled, targets, EMBED, MemoryParams(neighbours=7)))
    grown = MemoryRouter.attach(router, LabelMemory.empty(EMBED + EXTRA, EMBED, MemoryParams(neighbours=7)))
    for i in range(40):
        grown = grown.with_labels(labelled[i:i + 1], targets[i:i + 1])
    assert len(grown.memory) == 40
    np.testing.assert_allclose(grown.predict_proba(queries), whole.predict_proba(queries), atol=WITHIN)
    assert not np.allclose(whole.predict_proba(queries), router.predict_proba(queries), atol=1e-3)


def test_conflicting_labels_of_one_prompt_are_counted() -> None:
    rng = np.random.default_rng(4)
    x = _unit(rng, 4)
    memory = LabelMemory(x, np.asarray([0.0, 1.0, 0.2, 0.3]), EMBED, keys=("a", "a", "b", "b"))
    assert memory.conflicts() == 1  # "a" was labelled 0 and 1; "b" 0.2 and 0.3 agree within the tolerance
    # needs_flagship 0 against 1 (targets 0.5 and 1, exactly the tolerance apart) is a contradiction too
    verdicts = LabelMemory(x, np.asarray([0.5, 1.0, 0.5, 0.75]), EMBED, keys=("a", "a", "b", "b"))
    assert verdicts.conflicts() == 1


def test_bad_rows_are_refused() -> None:
    rng = np.random.default_rng(5)
    with pytest.raises(ValueError, match="targets in"):
        LabelMemory(_unit(rng, 2), np.asarray([0.5, 1.5]), EMBED)
    for bad in ({"bandwidth": 0.0}, {"slope_scale": 0.0}, {"shrink": -0.1}):
        with pytest.raises(ValueError, match="positive"):
            MemoryParams(**bad)  # type: ignore[arg-type]


def test_the_file_round_trips_and_a_corrupt_or_foreign_one_is_refused(tmp_path: Path) -> None:
    rng = np.random.default_rng(6)
    memory = LabelMemory(_unit(rng, 3), np.asarray([0.1, 0.9, 0.4]), EMBED, MemoryParams(11, 0.1, 2.0),
                         keys=("a", "b", "c"))
    path = save_memory(memory, tmp_path / "tenant-a.json", embedder="test-embedder")
    loaded, meta = load_memory(path, embedder="test-embedder")
    assert np.array_equal(loaded.rows, memory.rows) and np.array_equal(loaded.targets, memory.targets)
    assert loaded.params == memory.params and loaded.keys == memory.keys and meta["labels"] == 3
    older = json.loads(path.read_text())  # a file written before `structure`, `slope` and the rest existed
    older["params"] = {"neighbours": 11, "bandwidth": 0.1, "prior": 2.0}
    path.write_text(json.dumps(older))
    assert load_memory(path)[0].params == MemoryParams(11, 0.1, 2.0)  # the newer fields: their defaults
    with pytest.raises(ArtifactError, match="holds vectors of"):
        load_memory(path, embedder="another-embedder")
    _, payload = memory_paths(path)
    data = bytearray(payload.read_bytes())
    data[len(data) // 2] ^= 0xFF
    payload.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="sha256"):
        load_memory(path)


def test_the_slope_and_level_are_read_off_the_labels() -> None:
    """Targets that are the router's scores on a flatter, lower scale give that slope and level back (to the
    pull of the slope's ridge, 1 against 2,000 labels); without `slope`, the level alone."""
    z = np.random.default_rng(9).normal(scale=2.0, size=2000)
    targets = 1.0 / (1.0 + np.exp(-(0.5 * z - 0.3)))
    a, c = fit_scale(z, targets)
    assert a == pytest.approx(0.5, abs=0.01) and c == pytest.approx(-0.3, abs=0.01)
    a, c = fit_scale(z, targets, slope=False)
    assert a == 1.0 and float(np.mean(1.0 / (1.0 + np.exp(-(z + c))))) == pytest.approx(float(targets.mean()))


def test_a_few_labels_cannot_fling_the_slope() -> None:
    """Two labels the router ranks right would take an unbounded slope without the ridge; it stays near 1."""
    a, _ = fit_scale(np.asarray([-1.0, 1.0]), np.asarray([0.0, 1.0]))
    assert 1.0 < a < 3.0
    assert fit_scale(np.zeros(3), np.asarray([0.2, 0.4, 0.9]))[0] == 1.0  # no spread in the logits: no slope


def test_a_fitted_slope_gives_the_routers_score_back_where_no_label_is_near() -> None:
    """The score goes onto the labels' scale (slope and level) and back: with no label near, exactly the router's."""
    rng = np.random.default_rng(10)
    router, labelled, far = _router(rng), _unit(rng, 50), _unit(rng, 30)
    labelled[:, 0] = 0.0  # no label on the first axis
    labelled[:, :EMBED] /= np.linalg.norm(labelled[:, :EMBED], axis=1, keepdims=True)
    far[:, :EMBED] = np.eye(EMBED)[0]  # every query on it: similarity 0, weight exp(-1 / 0.02)
    params = MemoryParams(bandwidth=0.02, structure=0.0, early_labels=0)
    attached = MemoryRouter.attach(router, LabelMemory(labelled, rng.uniform(size=50), EMBED, params))
    assert attached.slope != pytest.approx(1.0, abs=0.01)
    np.testing.assert_allclose(attached.predict_proba(far), router.predict_proba(far), atol=WITHIN)


def test_the_structural_columns_tell_apart_labels_with_one_embedding() -> None:
    """Two labels with one embedding, a short prompt that needed the flagship and a long one that did not: with
    `structure` a query moves towards the label of its own shape; with 0 both queries move alike."""
    rng = np.random.default_rng(11)
    router, rows = _router(rng), np.repeat(_unit(rng, 1), 2, axis=0)
    rows[:, EMBED:] = [[1.0, 0.0], [-1.0, 0.0]]
    targets = np.asarray([1.0, 0.5])

    def scores(structure: float) -> npt.NDArray[np.float64]:
        params = MemoryParams(neighbours=2, structure=structure, slope=False)
        return MemoryRouter.attach(router, LabelMemory(rows, targets, EMBED, params)).adjust(rows, np.full(2, 0.3))

    with_shape, without = scores(1.0), scores(0.0)
    assert with_shape[0] > with_shape[1] + 0.01
    assert without[0] == pytest.approx(without[1], abs=WITHIN)
    with pytest.raises(ValueError, match="reads 10 columns"):
        shaped = LabelMemory(rows, targets, EMBED, MemoryParams(structure=1.0))
        MemoryRouter.attach(router, shaped).adjust(rows[:, :EMBED], np.full(2, 0.3))


def test_the_slope_is_read_at_its_scale_and_the_level_refitted() -> None:
    """`slope_scale` multiplies the fitted slope; the level is fitted again so the labels' mean target is kept;
    without `slope` (the level alone) the scale is not used."""
    z = np.random.default_rng(12).normal(scale=2.0, size=2000)
    targets = 1.0 / (1.0 + np.exp(-(0.8 * z - 0.3)))
    fitted_a, _ = fit_scale(z, targets)
    a, c = reading_scale(z, targets, MemoryParams(slope_scale=0.5))
    assert a == pytest.approx(0.5 * fitted_a, rel=1e-12)
    assert float(np.mean(1.0 / (1.0 + np.exp(-(a * z + c))))) == pytest.approx(float(targets.mean()), abs=1e-9)
    assert reading_scale(z, targets, MemoryParams(slope=False, slope_scale=0.5)) == fit_scale(z, targets, False)
    assert reading_scale(z, targets, MemoryParams(slope_scale=1.0)) == fit_scale(z, targets)


def test_a_move_its_neighbours_disagree_about_shrinks() -> None:
    """Ten labels at the query with mean target 0.75, ten far away with 0.5 (they set the level): where the ten
    agree (all 0.75) the query moves by the whole shift whatever `shrink` is; where they disagree (0.5 and 1
    alternating, the same mean) it moves less far, the less the larger `shrink`; `shrink` 0 moves both alike."""
    rng = np.random.default_rng(13)
    router, query = _router(rng), _unit(rng, 1)
    far = _unit(rng, 10)
    far[:, :EMBED] = np.eye(EMBED)[1]
    query[0, :EMBED] = np.eye(EMBED)[0]  # orthogonal to the far labels: they are not among its 10 neighbours
    rows = np.vstack([np.repeat(query, 10, axis=0), far])

    def moved(near_targets: npt.NDArray[np.float64], shrink: float) -> float:
        params = MemoryParams(neighbours=10, structure=0.0, slope=False, shrink=shrink, early_labels=0)
        targets = np.concatenate([near_targets, np.full(10, 0.5)])
        return float(MemoryRouter.attach(router, LabelMemory(rows, targets, EMBED, params)).predict_proba(query)[0])

    base = float(router.predict_proba(query)[0])
    agree, disagree = np.full(10, 0.75), np.tile([0.5, 1.0], 5)
    assert moved(agree, 0.0) == pytest.approx(moved(disagree, 0.0), abs=WITHIN)  # no shrink: the mean alone
    assert moved(agree, 0.3) == pytest.approx(moved(agree, 0.0), abs=WITHIN)  # agreeing labels: no shrink
    size = [abs(moved(disagree, shrink) - base) for shrink in (0.0, 0.3, 3.0)]
    assert size[0] > 0.02 and size[0] > size[1] > size[2] > 0


def _with_sources(router: LinearRouter, rng: np.random.Generator, k: int = 3) -> LinearRouter:
    weights = rng.normal(scale=0.5, size=(k, EMBED + EXTRA)).astype(np.float32)
    return LinearRouter(router.weights, router.bias, SourceRouters(tuple("abc"[:k]), weights, np.zeros(k)))


def test_labels_that_one_source_router_ranks_lean_the_combination_towards_it() -> None:
    """Targets that follow source router "b"'s logit (made up, to check the fit): with many labels the combination
    weighs "b" most; with a handful the ridge keeps it near the pooled router (weights near 0)."""
    rng = np.random.default_rng(21)
    router = _with_sources(_router(rng), rng)
    assert router.sources is not None
    x = _unit(rng, 2000)
    own = router.sources.logits(x)
    targets = 1.0 / (1.0 + np.exp(-own[:, 1]))
    logits = x.astype(np.float64) @ router.weights + router.bias
    many = fit_combination(logits, own, targets, ridge=300.0)
    assert int(np.argmax(np.abs(many.weights))) == 1 and many.weights[1] > 0.3
    few = fit_combination(logits[:5], own[:5], targets[:5], ridge=300.0)
    assert np.abs(few.weights).max() < 0.05 * many.weights[1]
    alone = fit_combination(logits, own[:, :0], targets, ridge=300.0)  # no source routers: the router alone
    assert (alone.slope, alone.level, len(alone.weights)) == (1.0, 0.0, 0)


def test_with_no_label_near_the_score_is_the_routers_read_with_the_combination() -> None:
    """Far from every label the score is the combination's, read on the labels' scale and mapped back by the
    router's own reading (the router score that gives that probability); with `sources` 0 it is the router's score
    exactly, as before the combination existed."""
    rng = np.random.default_rng(22)
    router = _with_sources(_router(rng), rng)
    assert router.sources is not None
    labelled, far = _unit(rng, 400), _unit(rng, 20)
    labelled[:, 0] = 0.0
    labelled[:, :EMBED] /= np.linalg.norm(labelled[:, :EMBED], axis=1, keepdims=True)
    far[:, :EMBED] = np.eye(EMBED)[0]
    targets = 1.0 / (1.0 + np.exp(-router.sources.logits(labelled)[:, 2]))
    params = MemoryParams(bandwidth=0.02, structure=0.0, early_labels=0)
    attached = MemoryRouter.attach(router, LabelMemory(labelled, targets, EMBED, params))
    assert attached.reads_features and len(attached.combination.weights) == 3
    combined = attached.combination.logits(far.astype(np.float64) @ router.weights + router.bias,
                                           router.sources.logits(far))
    (a, c), (back_a, back_c) = (attached.slope, attached.level), attached.back
    expected = (a * combined + c - back_c) / back_a
    np.testing.assert_allclose(attached.predict_proba(far), 1.0 / (1.0 + np.exp(-expected)), atol=WITHIN)
    plain = MemoryRouter.attach(router, LabelMemory(labelled, targets, EMBED, replace(params, sources=0.0)))
    assert not plain.reads_features
    np.testing.assert_allclose(plain.predict_proba(far), router.predict_proba(far), atol=WITHIN)
    grown = MemoryRouter.attach(router, LabelMemory(labelled[:300], targets[:300], EMBED, params)).with_labels(
        labelled[300:], targets[300:])
    np.testing.assert_allclose(grown.predict_proba(far), attached.predict_proba(far), atol=WITHIN)  # one at a time


def test_fewer_labels_than_early_labels_move_with_the_early_bandwidth_and_shrink() -> None:
    params = MemoryParams(bandwidth=0.1, shrink=0.3, early_labels=300, early_shrink=0.9, early_bandwidth=0.125)
    assert params.moving(299) == (0.125, 0.9) and params.moving(300) == (0.1, 0.3)
    assert replace(params, early_labels=0).moving(0) == (0.1, 0.3)
