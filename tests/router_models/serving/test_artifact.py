"""Artifacts round-trip, and corrupt or incompatible ones are refused with a fix in the message."""

from __future__ import annotations

import json
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
from router_models.serving.classifier import LinearRouter
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
def test_shipped_leave_one_source_out_figures_are_recomputed_from_the_outcomes() -> None:
    """The held-out figures the fast artifact states about itself are recomputed here: the smallest source
    (GSM8K, 1,307 prompts) held out, the router fitted on the five others with the artifact's own configuration,
    its held-out scores measured. A figure edited in the JSON, or a fit that no longer gives what was shipped,
    fails this. (The default artifact's embedder takes minutes on 38,000 prompts; `cascade router eval` on it
    prints the same table.) About 20 s, most of it the structural features of 38,000 prompts."""
    art = load_artifact(FAST_ARTIFACT)
    examples = load_outcomes(DEFAULT_ROUTING_DIR)
    assert data_hash(examples) == art.metadata["data_sha256"], (
        f"the outcomes under {DEFAULT_ROUTING_DIR} are not what {FAST_ARTIFACT.name} was trained on: retrain it")
    cfg = TrainConfig(routing_dir=DEFAULT_ROUTING_DIR, target=art.metadata["target"],
                      feature_set=art.metadata["feature_set"])
    x = features(make_embedder(art.embedder), examples, cfg.feature_set)
    result = leave_one_source_out(x, examples, cfg, sources=[HELD_OUT])
    stored = art.metadata["evaluation"]["per_source"][HELD_OUT]
    assert {**result.metrics[HELD_OUT].as_dict(), "alpha": result.alphas[HELD_OUT]} == stored
    assert stored["apgr"] > 0.55  # better than random routing (0.5) on a kind of prompt the fit never saw


def test_the_default_artifact_is_the_better_router_and_the_fast_one_is_static() -> None:
    """Quality first: the default routes at least as well, leave one source out, as the fast one it ships with."""
    default, fast = load_artifact(DEFAULT_ARTIFACT), load_artifact(FAST_ARTIFACT)
    assert fast.embedder == "all-MiniLM-L6-v2:static" and "static" not in default.embedder
    assert default.metadata["evaluation"]["mean"]["apgr"] >= fast.metadata["evaluation"]["mean"]["apgr"]
