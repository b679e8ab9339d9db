"""The trained router on disk: `<stem>.npz` (weights) beside `<stem>.json` (metadata).

The payload holds plain float arrays (read with `allow_pickle=False`); the metadata holds its sha256, the
artifact format and feature versions, the embedder name, the training-data hash, metrics and the date.
`load_artifact` verifies all of them and raises `ArtifactError` (with how to fix it) rather than serve a
corrupt or mismatched model.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from router_models.embedders.features import FEATURE_NAMES, FEATURE_VERSION
from router_models.serving.classifier import LinearRouter, SourceRouters

__all__ = [
    "ARTIFACT_FORMAT",
    "DEFAULT_ARTIFACT",
    "FAST_ARTIFACT",
    "ArtifactError",
    "RouterArtifact",
    "artifact_version",
    "current_artifact_path",
    "default_store_dir",
    "load_artifact",
    "overflow_artifact",
    "promoted_artifacts",
    "read_metadata",
    "read_payload",
    "replace_atomically",
    "save_artifact",
    "servable_artifact",
]

_log = logging.getLogger(__name__)

ARTIFACT_FORMAT = 1
DEFAULT_ARTIFACT = Path(__file__).resolve().parents[1] / "artifacts" / "complexity-router.json"
FAST_ARTIFACT = DEFAULT_ARTIFACT.with_name("complexity-router-static.json")  # same data and target, no model call
_FIX = "retrain with `cascade router train` (it writes a fresh artifact)"


class ArtifactError(Exception):
    """The router artifact is missing, corrupt, or was built for other code (format, features, embedder)."""


@dataclass(frozen=True)
class RouterArtifact:
    """A loaded router: the classifier head plus the metadata it was trained under."""

    router: LinearRouter
    embedder: str
    metadata: dict[str, Any] = field(default_factory=dict)


def _payload_bytes(router: LinearRouter) -> bytes:
    """The npz payload: `weights` and `bias`, and the per-source routers' `source_weights` and `source_biases` when
    the router carries them (their names go in the metadata, `source_routers`)."""
    buf = io.BytesIO()
    arrays = {"weights": router.weights.astype(np.float32), "bias": np.asarray([router.bias], np.float64)}
    if router.sources is not None:
        arrays |= {"source_weights": router.sources.weights.astype(np.float32),
                   "source_biases": router.sources.biases.astype(np.float64)}
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    return buf.getvalue()


def _paths(path: str | Path) -> tuple[Path, Path]:
    p = Path(path)
    if p.is_dir():
        p = p / DEFAULT_ARTIFACT.name
    return p.with_suffix(".json"), p.with_suffix(".npz")


def save_artifact(artifact: RouterArtifact, path: str | Path = DEFAULT_ARTIFACT) -> Path:
    """Write payload then metadata (metadata last, so a crash mid-write leaves a refused, not a wrong, model).

    Returns the metadata path. Adds format/feature versions, embedder, dim and the payload sha256.
    """
    meta_path, payload_path = _paths(path)
    meta_path.parent.mkdir(parents=True, exist_ok=True)
    payload = _payload_bytes(artifact.router)
    payload_path.write_bytes(payload)
    meta = dict(artifact.metadata)
    meta.update(
        artifact_format=ARTIFACT_FORMAT,
        feature_version=FEATURE_VERSION,
        feature_names=list(FEATURE_NAMES),
        embedder=artifact.embedder,
        dim=artifact.router.dim,
        source_routers=list(artifact.router.sources.names) if artifact.router.sources is not None else [],
        payload_file=payload_path.name,
        payload_sha256=hashlib.sha256(payload).hexdigest(),
    )
    meta_path.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return meta_path


def read_metadata(meta_path: Path, what: str = "router artifact", meta: str = "router metadata",
                  fix: str = _FIX) -> dict[str, Any]:
    """A verified file's JSON metadata as a dict; `ArtifactError` naming `what` (missing) or `meta` (unreadable,
    not an object) and how to `fix` it."""
    try:
        loaded = json.loads(meta_path.read_text())
    except FileNotFoundError as exc:
        raise ArtifactError(f"{what} not found: {meta_path}; {fix}") from exc
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"{meta} {meta_path} is unreadable ({exc}); {fix}") from exc
    if not isinstance(loaded, dict):
        raise ArtifactError(f"{meta} {meta_path} is not a JSON object; {fix}")
    return loaded


def _compatibility_problem(meta: dict[str, Any], meta_path: Path, embedder: str | None) -> str | None:
    """What in `meta` this code cannot serve (format, features, or the embedder asked for), or None."""
    checks = (
        ("artifact_format", ARTIFACT_FORMAT),
        ("feature_version", FEATURE_VERSION),
        ("feature_names", list(FEATURE_NAMES)),
    )
    for key, expected in checks:
        if meta.get(key) != expected:
            return f"router artifact {meta_path} has {key}={meta.get(key)!r} but this code needs {expected!r}; {_FIX}"
    if embedder is not None and meta.get("embedder") != embedder:
        return (f"router artifact {meta_path} was trained with embedder {meta.get('embedder')!r}, not {embedder!r}; "
                f"serve it with its own embedder or {_FIX}")
    return None


def _check_compatible(meta: dict[str, Any], meta_path: Path, embedder: str | None) -> None:
    problem = _compatibility_problem(meta, meta_path, embedder)
    if problem is not None:
        raise ArtifactError(problem)


def replace_atomically(path: Path, data: bytes) -> None:
    """Write `data` at `path` so that a reader or a crash sees the old file or the new one, never a part: a
    temporary file beside it, written and fsynced, then renamed over it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(path)


def read_payload(meta: dict[str, Any], meta_path: Path, what: str = "router payload",
                 fix: str = _FIX) -> tuple[Path, bytes]:
    """The payload file `meta` names beside `meta_path` and its bytes, checked against its sha256; `ArtifactError`
    naming `what` (missing, corrupt) and how to `fix` it."""
    payload_path = meta_path.parent / str(meta.get("payload_file", ""))
    try:
        payload = payload_path.read_bytes()
    except OSError as exc:
        raise ArtifactError(f"{what} {payload_path} is missing ({exc}); {fix}") from exc
    if hashlib.sha256(payload).hexdigest() != meta.get("payload_sha256"):
        raise ArtifactError(f"{what} {payload_path} fails its sha256 check (corrupt?); {fix}")
    return payload_path, payload


def _read_payload(meta: dict[str, Any], meta_path: Path) -> LinearRouter:
    payload_path, payload = read_payload(meta, meta_path)
    try:
        with np.load(io.BytesIO(payload), allow_pickle=False) as npz:
            weights = np.asarray(npz["weights"], dtype=np.float32)
            bias = float(npz["bias"][0])
            names = tuple(str(n) for n in meta.get("source_routers") or ())
            sources = SourceRouters(names, np.asarray(npz["source_weights"], np.float32),
                                    np.asarray(npz["source_biases"], np.float64)) if names else None
    except (OSError, ValueError, KeyError) as exc:
        raise ArtifactError(f"router payload {payload_path} is unreadable ({exc}); {_FIX}") from exc
    if weights.ndim != 1 or weights.shape[0] != meta.get("dim") or not np.all(np.isfinite(weights)):
        raise ArtifactError(f"router payload {payload_path} has bad weights {weights.shape}; {_FIX}")
    if sources is not None and sources.weights.shape[1] != weights.shape[0]:
        raise ArtifactError(f"router payload {payload_path} has source routers of {sources.weights.shape[1]} "
                            f"columns for a router of {weights.shape[0]}; {_FIX}")
    return LinearRouter(weights=weights, bias=bias, sources=sources)


def default_store_dir() -> Path:
    """The versioned artifact store (`artifact_store`): `$CASCADE_HOME/router`, else `./.cascade/router`,
    resolved against the current directory."""
    return Path(os.environ.get("CASCADE_HOME") or ".cascade").expanduser().resolve() / "router"


def promoted_artifacts(store: Path) -> list[tuple[str, Path]]:
    """(version, metadata path) of every artifact promoted into `store`, oldest first (`history.json`; the
    store's writer is `artifact_store.ArtifactStore`). Raises ArtifactError when the history is unreadable."""
    history = store / "history.json"
    if not history.exists():
        return []
    try:
        versions = json.loads(history.read_text())["promoted"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ArtifactError(f"router history {history} is unreadable ({exc}); fix or remove it "
                            "(the shipped artifact is served when it is absent)") from exc
    return [(str(v), store / "versions" / str(v) / DEFAULT_ARTIFACT.name) for v in versions]


def current_artifact_path(store: Path | None = None) -> Path:
    """The artifact served when none is named: `$CASCADE_ROUTER_ARTIFACT`, else the last one promoted into
    the versioned store that this code can serve, else the one shipped in the package.

    A promoted artifact built for other code (another artifact format or feature version: promoted before an
    upgrade that added feature columns) is passed over with a warning, not served and not fatal: after an
    upgrade the gateway starts and serves the newest compatible version (else the shipped artifact) until a
    retraining on this code promotes a new one. A corrupt artifact is still refused when loaded."""
    named = os.environ.get("CASCADE_ROUTER_ARTIFACT")
    if named:
        return Path(named)
    return servable_artifact(store or default_store_dir())


def servable_artifact(store: Path) -> Path:
    """The last artifact promoted into `store` that this code can serve, else the shipped one (warns of
    each newer one passed over)."""
    for version, path in reversed(promoted_artifacts(store)):
        problem = _incompatibility(path)
        if problem is None:
            return path
        _log.warning("router version %s in the store is not served: %s", version, problem)
    return DEFAULT_ARTIFACT


def _incompatibility(meta_path: Path) -> str | None:
    """Why this code cannot serve the artifact at `meta_path` (format or features), None when it can or when
    that cannot be told from its metadata (a missing or unreadable one is refused at load, loudly)."""
    try:
        meta = read_metadata(meta_path)
    except ArtifactError:
        return None
    return _compatibility_problem(meta, meta_path, None)


def artifact_version(path: str | Path, metadata: dict[str, Any]) -> str:
    """The name of the artifact at `path` that answers and cost records carry: its version in the store
    (`versions/<version>/`), else `<file stem>@<first 12 hex of its payload hash>` (the shipped ones)."""
    meta_path, _ = _paths(path)
    digest = str(metadata.get("payload_sha256", ""))[:12]
    if meta_path.parent.parent.name == "versions":
        return meta_path.parent.name
    return f"{meta_path.stem}@{digest}"


def load_artifact(path: str | Path | None = None, embedder: str | None = None) -> RouterArtifact:
    """Load and verify an artifact (default: `current_artifact_path()`).

    `path` is the `.json` metadata, the `.npz` payload or a folder holding `complexity-router.json`.
    If `embedder` is given it must equal the one the artifact was trained with. Raises `ArtifactError`.
    """
    meta_path, _ = _paths(path if path is not None else current_artifact_path())
    meta = read_metadata(meta_path)
    _check_compatible(meta, meta_path, embedder)
    router = _read_payload(meta, meta_path)
    return RouterArtifact(router=router, embedder=str(meta["embedder"]), metadata=meta)


def overflow_artifact(primary: str | Path | None, choice: str) -> Path | None:
    """The artifact that scores what the primary cannot in time (`classifier_scorer.ClassifierScorer`), or None.

    `choice`: "none"; "auto" (the fast shipped artifact when the primary is the shipped default, which it was
    trained beside on the same data and target and whose scores share its scale; nothing for any other
    primary, e.g. one promoted from the gateway's own labels); or a path. A named overflow artifact is
    verified now and must predict the same target as the primary. Raises `ArtifactError`.
    """
    if choice == "none":
        return None
    primary_meta, _ = _paths(primary if primary is not None else current_artifact_path())
    if choice == "auto":
        if primary_meta.resolve() != DEFAULT_ARTIFACT.resolve():
            return None
        path = FAST_ARTIFACT
    else:
        path, _ = _paths(choice)
    if path.resolve() == primary_meta.resolve():
        return None
    overflow = load_artifact(path)
    primary_target = read_metadata(primary_meta).get("target")
    if overflow.metadata.get("target") != primary_target:
        raise ArtifactError(f"router overflow artifact {path} predicts {overflow.metadata.get('target')!r} but "
                            f"the primary {primary_meta} predicts {primary_target!r}: their scores are not on one "
                            "scale; train both on the same target or use --router-overflow none")
    return path
