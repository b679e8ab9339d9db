"""A `DomainReference` on disk, beside the router artifact it describes: `<stem>-domain.npz` (the reference rows)
and `<stem>-domain.json` (metadata: the payload's sha256, the embedder, the calibration, how it was measured).

Stored apart from the artifact so that an artifact built before it keeps loading, unchanged (its payload hash and
version stay what they were), and so that `cascade router domain build` can add one to any artifact without
retraining it. Written payload first, metadata last, each through a temporary file renamed into place.

`reference_for(artifact)`: the reference beside the artifact; else, for an artifact on the embedder of one of the two
shipped artifacts (a version retrained on the same public sources plus the gateway's own labels), that one's
reference; else None:
the artifact has no in-domain figure, and every place that shows one says so (`in_domain` null/absent).
A reference that is there but corrupt, or on another embedder, raises `ArtifactError`.
"""

from __future__ import annotations

import hashlib
import io
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from router_models.serving.artifact import (
    DEFAULT_ARTIFACT,
    FAST_ARTIFACT,
    ArtifactError,
    read_metadata,
    read_payload,
    replace_atomically,
)
from router_models.serving.domain import DomainReference

__all__ = ["DOMAIN_FORMAT", "domain_path", "load_domain", "reference_for", "save_domain"]

DOMAIN_FORMAT = 1
_FIX = "rebuild it with `cascade router domain build --artifact <the artifact>`"


def domain_path(artifact: str | Path) -> Path:
    """The metadata path of the reference that belongs to the artifact at `artifact` (.json, .npz or folder)."""
    p = Path(artifact)
    if p.is_dir():
        p = p / DEFAULT_ARTIFACT.name
    return p.with_name(f"{p.with_suffix('').name}-domain.json")


def save_domain(reference: DomainReference, path: Path, embedder: str,
                extra: dict[str, Any] | None = None) -> Path:
    """Write `reference` (rows of `embedder`'s vectors) at `path` (the metadata .json); returns it."""
    meta_path, payload_path = path.with_suffix(".json"), path.with_suffix(".npz")
    meta_path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    np.savez(buf, rows=np.asarray(reference.rows, np.float16))
    payload = buf.getvalue()
    replace_atomically(payload_path, payload)
    meta = dict(extra or {})
    meta.update(domain_format=DOMAIN_FORMAT, embedder=embedder, dim=reference.dim, rows=int(reference.rows.shape[0]),
                neighbours=reference.neighbours, knots=list(reference.knots), levels=list(reference.levels),
                sources=list(reference.sources), created=datetime.now(UTC).isoformat(timespec="seconds"),
                payload_file=payload_path.name, payload_sha256=hashlib.sha256(payload).hexdigest())
    replace_atomically(meta_path, (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode())
    return meta_path


def load_domain(path: Path, embedder: str | None = None) -> tuple[DomainReference, dict[str, Any]]:
    """The reference at `path` (its .json) and its metadata, verified (format, payload hash, and `embedder` when
    given). Raises `ArtifactError`."""
    meta_path = path.with_suffix(".json")
    meta = read_metadata(meta_path, "domain reference", "domain reference metadata", _FIX)
    if meta.get("domain_format") != DOMAIN_FORMAT:
        raise ArtifactError(f"domain reference {meta_path} has domain_format={meta.get('domain_format')!r} but "
                            f"this code needs {DOMAIN_FORMAT}; {_FIX}")
    if embedder is not None and meta.get("embedder") != embedder:
        raise ArtifactError(f"domain reference {meta_path} holds vectors of {meta.get('embedder')!r}, but the "
                            f"router embeds with {embedder!r}; {_FIX}")
    payload_path, payload = read_payload(meta, meta_path, "domain reference payload", _FIX)
    try:
        with np.load(io.BytesIO(payload), allow_pickle=False) as npz:
            rows = np.asarray(npz["rows"], np.float16)
        reference = DomainReference(rows, int(meta["neighbours"]), tuple(float(k) for k in meta["knots"]),
                                    tuple(float(v) for v in meta["levels"]),
                                    tuple(str(s) for s in meta.get("sources", ())))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ArtifactError(f"domain reference {payload_path} is unreadable ({exc}); {_FIX}") from exc
    if reference.dim != meta.get("dim"):
        raise ArtifactError(f"domain reference {payload_path} has {reference.dim} columns, its metadata "
                            f"{meta.get('dim')}; {_FIX}")
    return reference, meta


def reference_for(artifact: str | Path, embedder: str) -> tuple[DomainReference, dict[str, Any]] | None:
    """The reference of the artifact at `artifact` trained on `embedder`'s vectors (module docstring), or None
    when it has none. Raises `ArtifactError` for one that is there but cannot be served."""
    own = domain_path(artifact)
    if own.exists():
        return load_domain(own, embedder)
    for shipped in (domain_path(DEFAULT_ARTIFACT), domain_path(FAST_ARTIFACT)):
        if not shipped.exists():
            continue
        try:
            meta = json.loads(shipped.read_text())
        except (OSError, ValueError):
            meta = {}
        if isinstance(meta, dict) and meta.get("embedder") == embedder:
            return load_domain(shipped, embedder)
    return None
