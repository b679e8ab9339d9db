"""Artifacts round-trip, and corrupt or incompatible ones are refused with a fix in the message."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from router_models.embedders.factory import make_embedder
from router_models.embedders.features import FEATURE_VERSION
from router_models.serving.artifact import (
    DEFAULT_ARTIFACT,
    ArtifactError,
    RouterArtifact,
    load_artifact,
    save_artifact,
)
from router_models.serving.classifier import LinearRouter, SourceRouters
from router_models.training.loso import leave_one_source_out
from router_models.training.outcomes import DEFAULT_ROUTING_DIR, data_hash, load_outcomes
from router_models.training.trainer import TrainConfig, features


def _saved(tmp_path: Path) -> Path:
    router = LinearRouter(weights=(np.arange(5) / 10).astype(np.float32), bias=-0.25)
    art = RouterArtifact(router=router, embedder="fake:8", metadata={"metrics": {"auc": 0.7}})
    return save_artifact(art, tmp_path / "r.json")


def test_round_trip(tmp_path: Path) -> None:
    meta = _saved(tmp_path)
    art = load_artifact(meta, embedder="fake:8")
    assert art.router.bias == -0.25
    assert art.router.weights.tolist() == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4])
    assert art.metadata["metrics"] == {"auc": 0.7}
    assert load_artifact(tmp_path / "r.npz").embedder == "fake:8"


def test_the_per_source_routers_travel_with_the_router(tmp_path: Path) -> None:
    sources = SourceRouters(("a", "b"), (np.arange(10).reshape(2, 5) / 10).astype(np.float32), np.asarray([0.5, -1.0]))
    router = LinearRouter(weights=np.ones(5, np.float32), bias=0.0, sources=sources)
    meta = save_artifact(RouterArtifact(router=router, embedder="fake:8"), tmp_path / "r.json")
    loaded = load_artifact(meta, embedder="fake:8").router.sources
    assert loaded is not None and loaded.names == ("a", "b") and loaded.biases.tolist() == [0.5, -1.0]
    assert np.array_equal(loaded.weights, sources.weights)
    assert load_artifact(_saved(tmp_path), embedder="fake:8").router.sources is None  # an artifact without them
    wrong = LinearRouter(weights=np.ones(4, np.float32), bias=0.0, sources=sources)  # 4 columns against their 5
    save_artifact(RouterArtifact(router=wrong, embedder="fake:8"), tmp_path / "w.json")
    with pytest.raises(ArtifactError, match="source routers of 5 columns for a router of 4"):
        load_artifact(tmp_path / "w.json", embedder="fake:8")


def test_corrupt_payload_refused(tmp_path: Path) -> None:
    meta = _saved(tmp_path)
    payload = tmp_path / "r.npz"
    data = bytearray(payload.read_bytes())
    data[-10] ^= 0xFF
    payload.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=r"sha256.*cascade router train"):
        load_artifact(meta)


def test_missing_payload_and_metadata(tmp_path: Path) -> None:
    meta = _saved(tmp_path)
    (tmp_path / "r.npz").unlink()
    with pytest.raises(ArtifactError, match="missing"):
        load_artifact(meta)
    with pytest.raises(ArtifactError, match="not found"):
        load_artifact(tmp_path / "nope.json")


def test_garbage_metadata_refused(tmp_path: Path) -> None:
    meta = _saved(tmp_path)
    meta.write_text("{not json")
    with pytest.raises(ArtifactError, match="unreadable"):
        load_artifact(meta)


@pytest.mark.parametrize(("key", "value"), [("feature_version", 999), ("feature_version", FEATURE_VERSION - 1),
                                           ("artifact_format", 0)])
def test_incompatible_versions_refused(tmp_path: Path, key: str, value: int) -> None:
    meta = _saved(tmp_path)
    doc = json.loads(meta.read_text())
    doc[key] = value
    meta.write_text(json.dumps(doc))
    with pytest.raises(ArtifactError, match=rf"{key}=.*cascade router train"):
        load_artifact(meta)


def test_other_embedder_refused(tmp_path: Path) -> None:
    meta = _saved(tmp_path)
    with pytest.raises(ArtifactError, match="trained with embedder 'fake:8'"):
        load_artifact(meta, embedder="all-MiniLM-L6-v2:fp32:t256")


def test_shipped_artifact_is_valid_and_small() -> None:
    art = load_artifact(DEFAULT_ARTIFACT)
    assert art.metadata["payload_sha256"]
    for key in ("data_sha256", "created", "evaluation", "quality_curve", "embedder", "feature_version", "target"):
        assert key in art.metadata
    size = sum(p.stat().st_size for p in DEFAULT_ARTIFACT.parent.iterdir())
    assert size < 5_000_000


FAST_ARTIFACT = DEFAULT_ARTIFACT.with_name("complexity-router-static.json")
HELD_OUT = "routellm-gsm8k"

# How far the held-out figures recomputed below may sit from the JSON's. The JSON keeps 4 decimals (5e-5 of each
# bound is that rounding). Another CPU's BLAS and torch kernels, and the float16 static table it builds for
# itself, move a held-out score by ~1e-6 (4.4e-6 at most, measured with OpenBLAS's Sandybridge kernels, torch
# without AVX and a table rebuilt with them), which only reorders near-tied prompts. Each bound covers the
# figure's largest change when all 1,307 scores are jittered by +-1e-4 at random (20x that; 300 draws).
RECOMPUTED_WITHIN = {
    "apgr": 2e-4,  # one swap of neighbours moves it by at most 2 / (1,307 prompts x gap 288) = 5.3e-6; jitter 1.5e-4
    "auc": 2e-4,  # one swap of a positive and a negative neighbour: 1 / (382 x 925) = 2.8e-6; jitter 1.6e-4
    "cpt50": 4e-3,  # steps of 1/1,307: a swap where the curve meets 50% or 80% moves the share to where
    "cpt80": 4e-3,  # the curve meets it next; jitter moved it by 4 prompts (3.1e-3)
    "brier": 1e-4,  # smooth in the scores: jitter moves them by under 6e-6, so the rounding dominates
    "mean_score": 1e-4,
    "ece": 1e-4,  # also smooth: no score lies within 1.4e-4 of a bin edge, so none changes bin
    "event_rate": 1e-4,  # the outcomes' targets only
}  # every other field is compared exactly: counts (n, positives) and the constants of random routing


@pytest.mark.parametrize("path", [DEFAULT_ARTIFACT, FAST_ARTIFACT], ids=["default", "fast"])
def test_shipped_artifact_headline_is_the_mean_of_its_held_out_sources(path: Path) -> None:
    """The mean APGR the learning loop compares candidates with is the mean of the per-source rows stored
    beside it (`LosoResult.mean`), not a figure of its own; the curve spans shares 0 to 1 in 21 points."""
    meta = load_artifact(path).metadata
    rows = meta["evaluation"]["per_source"]
    assert sorted(rows) == sorted(meta["sources"]) and len(rows) >= 2
    for key, value in meta["evaluation"]["mean"].items():
        assert value == pytest.approx(float(np.nanmean([float(r[key]) for r in rows.values()])), abs=1e-4), key
    shares = meta["quality_curve"]["flagship_share"]
    assert shares == pytest.approx([i / 20 for i in range(21)]) and len(meta["quality_curve"]["pgr"]) == 21


@pytest.mark.skipif(not DEFAULT_ROUTING_DIR.is_dir(),
                    reason=f"shared routing data not found at {DEFAULT_ROUTING_DIR} (set CASCADE_ROUTING_DATA)")
@pytest.mark.slow
def test_shipped_leave_one_source_out_figures_are_recomputed_from_the_outcomes() -> None:
    """The held-out figures the fast artifact states about itself are recomputed here: the smallest source
    (GSM8K, 1,307 prompts) held out, the router fitted on the six others with the artifact's own configuration,
    its held-out scores measured. A figure edited in the JSON by more than another CPU's float noise
    (`RECOMPUTED_WITHIN`), or a fit that no longer gives what was shipped, fails this. (The default artifact's
    embedder takes minutes on 38,000 prompts; `cascade router eval` on it prints the same table.) About 20 s,
    most of it the structural features of 38,000 prompts."""
    art = load_artifact(FAST_ARTIFACT)
    examples = load_outcomes(DEFAULT_ROUTING_DIR)
    assert data_hash(examples) == art.metadata["data_sha256"], (
        f"the outcomes under {DEFAULT_ROUTING_DIR} are not what {FAST_ARTIFACT.name} was trained on: retrain it")
    cfg = TrainConfig(routing_dir=DEFAULT_ROUTING_DIR, target=art.metadata["target"],
                      feature_set=art.metadata["feature_set"])
    x = features(make_embedder(art.embedder), examples, cfg.feature_set)
    result = leave_one_source_out(x, examples, cfg, sources=[HELD_OUT])
    stored = dict(art.metadata["evaluation"]["per_source"][HELD_OUT])
    # alpha is chosen from a grid by the inner out-of-source APGR, where 1.0 beats 0.3 by 2.1e-4 on this fold and
    # the kernels and table above move those two by under 1e-5: the same choice on any CPU, so compared exactly
    assert stored.pop("alpha") == result.alphas[HELD_OUT]
    recomputed = asdict(result.metrics[HELD_OUT])  # unrounded
    assert sorted(stored) == sorted(recomputed)
    for key, value in stored.items():
        if key in RECOMPUTED_WITHIN:
            assert abs(value - recomputed[key]) <= RECOMPUTED_WITHIN[key], (key, value, recomputed[key])
        else:
            assert value == recomputed[key], key
    assert stored["apgr"] > 0.55  # better than random routing (0.5) on a kind of prompt the fit never saw


def test_the_default_artifact_is_the_better_router_and_the_fast_one_is_static() -> None:
    """Quality first: the default routes at least as well, leave one source out, as the fast one it ships with."""
    default, fast = load_artifact(DEFAULT_ARTIFACT), load_artifact(FAST_ARTIFACT)
    assert fast.embedder == "all-MiniLM-L6-v2:static:t64" and "static" not in default.embedder
    assert default.metadata["evaluation"]["mean"]["apgr"] >= fast.metadata["evaluation"]["mean"]["apgr"]
