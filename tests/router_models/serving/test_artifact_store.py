"""Promoting, listing and rolling back router artifacts; the served artifact follows the store."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from router_models.embedders.features import FEATURE_NAMES
from router_models.serving.artifact import (
    DEFAULT_ARTIFACT,
    ArtifactError,
    RouterArtifact,
    current_artifact_path,
    save_artifact,
)
from router_models.serving.artifact_store import ArtifactStore
from router_models.serving.classifier import LinearRouter


def _artifact(tmp_path: Path, name: str, bias: float) -> Path:
    router = LinearRouter(weights=np.zeros(8 + len(FEATURE_NAMES), dtype=np.float32), bias=bias)
    meta = {"created": f"2026-12-01T00:00:0{int(bias)}+00:00"}
    return save_artifact(RouterArtifact(router=router, embedder="fake:8", metadata=meta), tmp_path / name / "a.json")


def test_promote_then_rollback(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    assert store.history() == [] and store.current_artifact() == DEFAULT_ARTIFACT
    first = store.promote(_artifact(tmp_path, "one", 1.0))
    second = store.promote(_artifact(tmp_path, "two", 2.0))
    assert [e.version for e in store.history()] == [first.version, second.version]
    assert store.current_artifact() == second.path
    assert store.rollback() == first.path
    assert store.rollback() == DEFAULT_ARTIFACT
    with pytest.raises(ArtifactError, match="nothing to roll back"):
        store.rollback()


def test_a_corrupt_candidate_is_refused_and_history_kept(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    good = store.promote(_artifact(tmp_path, "one", 1.0))
    bad = _artifact(tmp_path, "two", 2.0)
    bad.with_suffix(".npz").write_bytes(b"garbage")
    with pytest.raises(ArtifactError, match="sha256"):
        store.promote(bad)
    assert store.current_artifact() == good.path


def test_unreadable_history_is_a_clear_error(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    store.root.mkdir(parents=True)
    (store.root / "history.json").write_text("{not json")
    with pytest.raises(ArtifactError, match=r"history\.json is unreadable"):
        store.current_artifact()


def test_served_artifact_follows_env_and_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CASCADE_ROUTER_ARTIFACT", raising=False)
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path / "home"))
    assert current_artifact_path() == DEFAULT_ARTIFACT
    entry = ArtifactStore().promote(_artifact(tmp_path, "one", 1.0))
    assert current_artifact_path() == entry.path
    monkeypatch.setenv("CASCADE_ROUTER_ARTIFACT", "/elsewhere/r.json")
    assert current_artifact_path() == Path("/elsewhere/r.json")


def _age(meta_path: Path, feature_version: int) -> None:
    """Make a promoted artifact look as if an older code (other feature columns) had written it."""
    import json

    meta = json.loads(meta_path.read_text())
    meta["feature_version"] = feature_version
    meta_path.write_text(json.dumps(meta))


def test_after_an_upgrade_a_promoted_artifact_of_other_features_is_passed_over(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A store promoted into before an upgrade that changed the features must not stop the gateway: the newest
    version this code can serve is served (else the shipped one), with a warning naming the one passed over."""
    from router_models.embedders.features import FEATURE_VERSION
    from router_models.serving.artifact import load_artifact

    monkeypatch.delenv("CASCADE_ROUTER_ARTIFACT", raising=False)
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path / "home"))
    store = ArtifactStore()
    first = store.promote(_artifact(tmp_path, "one", 1.0))
    second = store.promote(_artifact(tmp_path, "two", 2.0))
    _age(second.path, FEATURE_VERSION - 1)
    assert current_artifact_path() == first.path == store.current_artifact()
    assert load_artifact(None).metadata["feature_version"] == FEATURE_VERSION
    assert f"router version {second.version} in the store is not served" in caplog.text
    _age(first.path, FEATURE_VERSION - 1)
    assert current_artifact_path() == DEFAULT_ARTIFACT
    with pytest.raises(ArtifactError, match="feature_version"):  # named explicitly, it is still refused
        load_artifact(second.path)
