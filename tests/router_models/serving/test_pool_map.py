"""The pool map's serving side: positions, quality, placements (fit, files, refusals) on small synthetic maps.
Synthetic numbers only test that the code does what it says; quality figures come from the harness on real data."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from router_models.serving.artifact import DEFAULT_ARTIFACT, ArtifactError, load_artifact
from router_models.serving.placement import (
    MIN_ROWS,
    Placement,
    PlacementError,
    PlaceRow,
    place_from_outcomes,
    place_from_shared,
    placement_prior,
)
from router_models.serving.pool_map import (
    DEFAULT_POOL_MAP,
    PoolMap,
    SharedAbility,
    load_pool_map,
    quality,
    save_pool_map,
)

DIM, K = 6, 2


def _map(version: str = "map@test", embedder: str = "emb") -> PoolMap:
    rng = np.random.default_rng(0)
    weights = rng.normal(size=(DIM, K + 1)).astype(np.float32)
    shared = {"src/strong": SharedAbility((1.5, 0.5, 0.0), (0.1, 0.1, 0.1), 300, 0.8),
              "src/weak": SharedAbility((-1.0, 0.0, 0.2), (0.1, 0.1, 0.1), 300, 0.3),
              "other/weak": SharedAbility((-0.5, 0.0, 0.0), (0.1, 0.1, 0.1), 300, 0.4)}
    return PoolMap(weights, np.zeros(K + 1), ("difficulty", "domain-1", "domain-2"), embedder, version, shared,
                   (0.0, 0.0, 0.0), (2.0, 1.0, 1.0))


def _embed_lookup(table: dict[str, np.ndarray]):  # type: ignore[no-untyped-def]
    def embed(texts, shapes):  # type: ignore[no-untyped-def]
        return np.stack([table[t] for t in texts])
    return embed


def _rows(pool_map: PoolMap, ability: np.ndarray, n: int, seed: int = 1) -> tuple[list[PlaceRow], dict]:  # type: ignore[type-arg]
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, DIM))
    pos = pool_map.positions(x)
    p = 1 / (1 + np.exp(-(ability[0] + pos[:, 1:] @ ability[1:] - pos[:, 0])))
    y = (rng.random(n) < p).astype(float)
    rows = [PlaceRow(f"prompt {i}", float(y[i]), None, f"rows.jsonl:{i + 1}") for i in range(n)]
    return rows, {f"prompt {i}": x[i] for i in range(n)}


def test_quality_is_the_sigmoid_of_ability_against_position() -> None:
    pool_map = _map()
    x = np.random.default_rng(3).normal(size=(5, DIM))
    strong, weak = place_from_shared(pool_map, "strong"), place_from_shared(pool_map, "src/weak")
    q = quality(pool_map, x, [weak, strong])
    pos = pool_map.positions(x)
    expect = 1 / (1 + np.exp(-(1.5 + pos[:, 1] * 0.5 - pos[:, 0])))
    assert q.shape == (5, 2)
    np.testing.assert_allclose(q[:, 1], expect, rtol=1e-9)
    assert np.all((q > 0) & (q < 1))


def test_more_rows_place_a_pool_more_surely_and_near_its_true_ability() -> None:
    pool_map, truth = _map(), np.array([0.8, -0.6, 0.4])
    small_rows, small_x = _rows(pool_map, truth, 100)
    big_rows, big_x = _rows(pool_map, truth, 3000)
    small = place_from_outcomes(pool_map, small_rows, _embed_lookup(small_x), "p", "rows.jsonl")
    big = place_from_outcomes(pool_map, big_rows, _embed_lookup(big_x), "p", "rows.jsonl")
    assert all(b < s for b, s in zip(big.se, small.se, strict=True))
    assert np.all(np.abs(np.array(big.ability) - truth) < 3 * np.array(big.se) + 0.05)
    assert big.rows == 3000 and big.origin == {"outcomes": "rows.jsonl"} and big.map_version == "map@test"


def test_few_rows_narrow_the_prior_on_the_domain_axes_alone() -> None:
    pool_map = _map()
    mean, sd = placement_prior(pool_map, 100)
    assert mean.tolist() == [0.0, 0.0, 0.0] and sd.tolist() == pytest.approx([2.0, 0.5, 0.5])  # sqrt(100 / 400)
    assert placement_prior(pool_map, 400)[1].tolist() == placement_prior(pool_map, 5000)[1].tolist() == [2.0, 1.0, 1.0]


def test_placement_round_trips_and_refuses_a_bad_file(tmp_path: Path) -> None:
    pool_map = _map()
    placed = place_from_shared(pool_map, "src/strong", pool="flagship")
    path = placed.save(tmp_path / "flagship.json")
    assert Placement.load(path, pool_map) == placed
    data = json.loads(path.read_text())
    for field, value, words in (("rows", MIN_ROWS - 1, f"at least {MIN_ROWS}"),
                                ("mean_quality", 1.5, r"outside \[0, 1\]"),
                                ("embedder", "other", "'embedder'"), ("map_version", "old", "'map_version'")):
        (tmp_path / "bad.json").write_text(json.dumps({**data, field: value}))
        with pytest.raises(PlacementError, match=words) as info:
            Placement.load(tmp_path / "bad.json", pool_map)
        assert "bad.json" in str(info.value)
    del data["ability"]
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(PlacementError, match="'ability' is missing"):
        Placement.load(tmp_path / "bad.json")


def test_outcome_rows_are_refused_with_their_line() -> None:
    pool_map = _map()
    rows, x = _rows(pool_map, np.zeros(K + 1), 120)
    bad = [*rows[:7], PlaceRow("prompt 7", 1.2, None, "rows.jsonl:8"), *rows[8:]]
    with pytest.raises(PlacementError, match=r"rows.jsonl:8: field 'quality' is 1.2"):
        place_from_outcomes(pool_map, bad, _embed_lookup(x), "p", "rows.jsonl")
    with pytest.raises(PlacementError, match=f"30 rows, a placement needs at least {MIN_ROWS}"):
        place_from_outcomes(pool_map, rows[:30], _embed_lookup(x), "p", "rows.jsonl")


def test_shared_model_names_must_be_unique() -> None:
    with pytest.raises(PlacementError, match="names several shared models"):
        place_from_shared(_map(), "weak")
    with pytest.raises(PlacementError, match="is no shared model"):
        place_from_shared(_map(), "nobody")


def test_map_file_round_trip_and_refusals(tmp_path: Path) -> None:
    path = save_pool_map(_map(), tmp_path / "map.json")
    loaded = load_pool_map(path, embedder="emb")
    assert loaded.version.startswith("pool-map@") and loaded.shared == _map().shared
    x = np.ones((2, DIM))
    np.testing.assert_allclose(loaded.positions(x), _map().positions(x), rtol=1e-6)
    with pytest.raises(ArtifactError, match="reads feature rows of embedder 'emb'"):
        load_pool_map(path, embedder="another")
    (tmp_path / "map.npz").write_bytes(b"corrupt")
    with pytest.raises(ArtifactError, match="sha256"):
        load_pool_map(path)


def test_shipped_map_reads_the_shipped_routers_feature_row() -> None:
    router = load_artifact(DEFAULT_ARTIFACT)
    pool_map = load_pool_map(DEFAULT_POOL_MAP, embedder=router.embedder)
    assert pool_map.dim == router.router.dim and pool_map.axes[0] == "difficulty"
    assert len(pool_map.shared) > 100  # every model of every source
    frontier = place_from_shared(pool_map, "routerbench/gpt-4-1106-preview")
    seven_b = place_from_shared(pool_map, "routerbench/mistralai/mistral-7b-chat")
    assert frontier.ability[0] > seven_b.ability[0]


def test_the_served_map_checks_placements_and_names_shared_models(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from router_models.serving import pool_map as served

    path = save_pool_map(_map(), tmp_path / "map.json")
    monkeypatch.setenv("CASCADE_POOL_MAP", str(path))
    pool_map = served.served_pool_map()
    assert served.pool_map_for("emb") is pool_map and served.pool_map_for("another embedder") is None
    assert Placement.named("src/strong").ability == (1.5, 0.5, 0.0)  # on the served map
    placed = place_from_shared(_map(), "src/strong").save(tmp_path / "old.json")  # placed on another map version
    with pytest.raises(PlacementError, match="field 'map_version' is 'map@test'"):
        Placement.load(placed)
    monkeypatch.setenv("CASCADE_POOL_MAP", str(tmp_path / "missing.json"))
    with pytest.raises(PlacementError, match="the pool map it is placed on cannot be loaded"):
        Placement.named("src/strong")


def test_the_shipped_map_served_is_the_one_on_the_scorers_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Named placements are read from the map the scorer's rows sit on: the fast artifact's map when the shipped
    default is served in two stages (the default) or the fast artifact alone, the transformer's map otherwise."""
    from router_models.serving import pool_map as served
    from router_models.serving.artifact import FAST_ARTIFACT

    monkeypatch.delenv("CASCADE_POOL_MAP", raising=False)
    monkeypatch.setenv("CASCADE_ROUTER_ARTIFACT", str(DEFAULT_ARTIFACT))
    for refine, expected in (("", served.STATIC_POOL_MAP), ("auto", served.STATIC_POOL_MAP),
                             ("none", served.DEFAULT_POOL_MAP)):
        monkeypatch.setenv("CASCADE_ROUTER_REFINE", refine)
        assert served.shipped_pool_map() == expected, refine
    monkeypatch.setenv("CASCADE_ROUTER_ARTIFACT", str(FAST_ARTIFACT))
    assert served.shipped_pool_map() == served.STATIC_POOL_MAP
    monkeypatch.setenv("CASCADE_ROUTER_REFINE", "")
    assert served.served_pool_map().embedder == load_artifact(FAST_ARTIFACT).embedder
    assert Placement.named("routerbench/gpt-4-1106-preview").embedder == load_artifact(FAST_ARTIFACT).embedder


def test_harness_hull_and_sweep() -> None:
    from loadtest.bench.pool_map_eval import hull_at, route_sweep, upper_hull

    hull = upper_hull([(1.0, 0.5), (2.0, 0.55), (3.0, 0.8), (10.0, 0.9), (4.0, 0.7)])
    assert hull == [(1.0, 0.5), (3.0, 0.8), (10.0, 0.9)]  # (2, .55) and (4, .7) lie under the mix of their ends
    assert hull_at(hull, 2.0) == 0.65 and np.isnan(hull_at(hull, 0.5)) and hull_at(hull, 20.0) == 0.9
    predicted = np.array([[0.2, 0.9], [0.8, 0.9]])
    cost, outcome = np.array([[1e-4, 1e-3], [1e-4, 1e-3]]), np.array([[0.0, 1.0], [1.0, 1.0]])
    sweep = route_sweep(predicted, cost, outcome)
    assert sweep[0] == (1e-3, 1.0) and sweep[-1] == (1e-4, 0.5)  # tradeoff 0: best quality; huge: cheapest
    assert any(abs(c - 5.5e-4) < 1e-12 and q == 1.0 for c, q in sweep)  # between: only the cheap model's miss goes up
