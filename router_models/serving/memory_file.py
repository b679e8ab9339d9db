"""A `LabelMemory` on disk: `<stem>.npz` (rows, targets, keys) beside `<stem>.json` (metadata), as the router
artifact is stored (`artifact.py`): plain arrays read with `allow_pickle=False`, the payload's sha256, the
feature version and names and the embedder in the metadata, written payload first and metadata last, each
through a temporary file renamed into place, so a reader sees the old memory or the new one, never half of one.

`load_memory` verifies all of it and raises `ArtifactError` (with how to fix it) rather than serve labels
computed for other features or another embedder; a caller that serves keeps its previous memory then.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from router_models.embedders.features import FEATURE_NAMES, FEATURE_VERSION
from router_models.serving.artifact import ArtifactError, read_metadata, read_payload, replace_atomically
from router_models.serving.label_memory import LabelMemory, MemoryParams

__all__ = ["MEMORY_FORMAT", "SHARED", "load_memory", "memory_path", "memory_paths", "save_memory"]

SHARED = "shared"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$")  # it goes into the router version cost records keep

MEMORY_FORMAT = 2
"""Written by a memory with labels per pool (`qualities` in the payload, `pools` in the metadata); one without them
is written as format 1, which a gateway from before labels per pool still reads. Both are read."""
_READ_FORMATS = (1, 2)
_FIX = "rebuild it with `cascade router memory add` from the label files"


def memory_paths(path: str | Path) -> tuple[Path, Path]:
    """(metadata .json, payload .npz) of the memory named by `path` (either file, or the stem)."""
    p = Path(path)
    return p.with_suffix(".json"), p.with_suffix(".npz")


def _payload(memory: LabelMemory) -> bytes:
    buf = io.BytesIO()
    keys = np.asarray(memory.keys if memory.keys else ("",) * len(memory), dtype=str)
    arrays = {"rows": memory.rows.astype(np.float32), "targets": memory.targets.astype(np.float64), "keys": keys}
    if memory.qualities is not None:
        arrays["qualities"] = memory.qualities.astype(np.float64)
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    return buf.getvalue()


def save_memory(memory: LabelMemory, path: str | Path, embedder: str, extra: dict[str, Any] | None = None) -> Path:
    """Write `memory` (labels on `embedder`'s vectors) at `path`; returns the metadata path."""
    meta_path, payload_path = memory_paths(path)
    meta_path.parent.mkdir(parents=True, exist_ok=True)
    payload = _payload(memory)
    replace_atomically(payload_path, payload)
    meta = dict(extra or {})
    if memory.qualities is not None:
        meta["pools"] = list(memory.pools)
    meta.update(memory_format=MEMORY_FORMAT if memory.qualities is not None else 1,
                feature_version=FEATURE_VERSION, feature_names=list(FEATURE_NAMES),
                embedder=embedder, embedding_dim=memory.embedding_dim, dim=int(memory.rows.shape[1]),
                labels=len(memory), conflicting_prompts=memory.conflicts(),
                params=asdict(memory.params),  # a file without a newer field reads its default
                updated=datetime.now(UTC).isoformat(timespec="seconds"),
                payload_file=payload_path.name, payload_sha256=hashlib.sha256(payload).hexdigest())
    replace_atomically(meta_path, (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode())
    return meta_path


def _metadata(meta_path: Path) -> dict[str, Any]:
    meta = read_metadata(meta_path, "label memory", "label memory metadata", _FIX)
    if meta.get("memory_format") not in _READ_FORMATS:
        raise ArtifactError(f"label memory {meta_path} has memory_format={meta.get('memory_format')!r} but this "
                            f"code reads {list(_READ_FORMATS)}; {_FIX}")
    expected = {"feature_version": FEATURE_VERSION, "feature_names": list(FEATURE_NAMES)}
    for key, value in expected.items():
        if meta.get(key) != value:
            raise ArtifactError(f"label memory {meta_path} has {key}={meta.get(key)!r} but this code needs "
                                f"{value!r}; {_FIX}")
    return meta


def load_memory(path: str | Path, embedder: str | None = None) -> tuple[LabelMemory, dict[str, Any]]:
    """The memory at `path` and its metadata, verified (format, features, payload hash, and `embedder` when
    given: the labels' vectors must come from the embedder the serving router uses). Raises `ArtifactError`."""
    meta_path, _ = memory_paths(path)
    meta = _metadata(meta_path)
    if embedder is not None and meta.get("embedder") != embedder:
        raise ArtifactError(f"label memory {meta_path} holds vectors of {meta.get('embedder')!r}, but the router "
                            f"embeds with {embedder!r}; {_FIX}")
    payload_path, payload = read_payload(meta, meta_path, "label memory payload", _FIX)
    try:
        with np.load(io.BytesIO(payload), allow_pickle=False) as npz:
            rows, targets, keys = npz["rows"], npz["targets"], npz["keys"]
            qualities = np.asarray(npz["qualities"], np.float64) if "qualities" in npz.files else None
        params = MemoryParams(**meta["params"])
        pools = tuple(str(p) for p in meta.get("pools") or ()) if qualities is not None else ()
        memory = LabelMemory(np.asarray(rows, np.float32), np.asarray(targets, np.float64),
                             int(meta["embedding_dim"]), params, tuple(str(k) for k in keys), pools, qualities)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ArtifactError(f"label memory {payload_path} is unreadable ({exc}); {_FIX}") from exc
    if memory.rows.shape[1] != meta.get("dim"):
        raise ArtifactError(f"label memory {payload_path} has {memory.rows.shape[1]} columns, its metadata "
                            f"{meta.get('dim')}; {_FIX}")
    return memory, meta


def memory_path(store: Path, name: str) -> Path:
    """The metadata file of memory `name` (a tenant's name, or `SHARED`) in the store `store`."""
    if not _NAME.match(name):
        raise ValueError(f"memory name {name!r} must be 1-40 letters, digits, '_', '.', '-' (a tenant's name)")
    return store / "memory" / f"{name}.json"
