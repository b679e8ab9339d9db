"""Artifacts round-trip, and corrupt or incompatible ones are refused with a fix in the message."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from router_models.serving.artifact import (
    DEFAULT_ARTIFACT,
    ArtifactError,
    RouterArtifact,
    load_artifact,
    save_artifact,
)
from router_models.serving.classifier import LinearRouter


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


@pytest.mark.parametrize(("key", "value"), [("feature_version", 999), ("artifact_format", 0)])
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


@pytest.mark.parametrize("path", [DEFAULT_ARTIFACT, FAST_ARTIFACT], ids=["default", "fast"])
def test_shipped_artifact_states_its_leave_one_source_out_figures(path: Path) -> None:
    """The figures each shipped artifact reports about itself come from held-out sources of real outcomes:
    mean APGR clearly above random routing (0.5) and a 21-point cost-quality curve from share 0 to 1."""
    meta = load_artifact(path).metadata
    mean = meta["evaluation"]["mean"]
    assert mean["apgr"] > 0.55, mean
    assert 0.0 <= mean["brier"] <= 0.25 and 0.0 <= mean["ece"] <= 0.2, mean
    assert len(meta["evaluation"]["per_source"]) == len(meta["sources"]) >= 2
    curve = meta["quality_curve"]
    assert "leave-one-source-out" in curve["basis"]
    shares, pgr = curve["flagship_share"], curve["pgr"]
    assert len(shares) == len(pgr) == 21
    assert shares[0] == pytest.approx(0.0) and shares[-1] == pytest.approx(1.0)
    assert shares == sorted(shares) and pgr[-1] == pytest.approx(1.0, abs=0.02)


def test_the_default_artifact_is_the_better_router_and_the_fast_one_is_static() -> None:
    """Quality first: the default routes at least as well, leave one source out, as the fast one it ships with."""
    default, fast = load_artifact(DEFAULT_ARTIFACT), load_artifact(FAST_ARTIFACT)
    assert fast.embedder == "all-MiniLM-L6-v2:static" and "static" not in default.embedder
    assert default.metadata["evaluation"]["mean"]["apgr"] >= fast.metadata["evaluation"]["mean"]["apgr"]
