"""Embeddings of training and evaluation texts, cached on disk per embedder so re-runs skip the model.

The cache file is keyed by the embedder's name and `cache_tag` (e.g. the ONNX graph's hash, so a re-export
never reuses stale vectors); entries by the sha1 of the text. Checkpointed every few thousand texts, so an
interrupted run keeps its work. Several processes may fill one cache file at once (a training beside a
benchmark): a save holds an exclusive lock on `<file>.lock`, merges in what the others saved, writes its own
temporary file and renames it into place, so none crashes and none drops another's vectors. Offline tooling only:
serving never reads it.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from router_models.embedders.onnx_minilm import default_cache_dir
from router_models.embedders.protocol import Embedder

__all__ = ["embed_cached"]

FloatArray = npt.NDArray[np.float32]


def _cache_path(embedder: Embedder, cache_dir: Path) -> Path:
    tag = getattr(embedder, "cache_tag", "")
    return cache_dir / f"{embedder.name.replace(':', '_')}{'_' + tag if tag else ''}.npz"


def embed_cached(embedder: Embedder, texts: Sequence[str], cache_dir: Path | None = None) -> FloatArray:
    """(n, dim) embeddings of `texts`, row i for texts[i], reusing vectors cached on disk. A concatenation
    (an embedder with `parts`) is cached part by part, so each part's vectors serve every run that uses it."""
    from tqdm import tqdm

    parts: Sequence[Embedder] = getattr(embedder, "parts", ())
    if parts:
        return np.hstack([embed_cached(p, texts, cache_dir) for p in parts]).astype(np.float32)

    path = _cache_path(embedder, cache_dir or default_cache_dir())
    keys = [hashlib.sha1(t.encode()).hexdigest() for t in texts]
    cache: dict[str, FloatArray] = {}
    if path.exists():
        cache = _load(path)
    missing = sorted({k: t for k, t in zip(keys, texts, strict=True) if k not in cache}.items())
    chunk = 256
    for n, start in enumerate(tqdm(range(0, len(missing), chunk), desc=f"embedding {len(missing)} texts",
                                   disable=not missing)):
        part = missing[start : start + chunk]
        for (k, _), vec in zip(part, embedder.embed([t for _, t in part]), strict=True):
            cache[k] = vec
        if n % 16 == 15 or start + chunk >= len(missing):
            _save(path, cache)
    if not keys:
        return np.zeros((0, embedder.dim), dtype=np.float32)
    return np.stack([cache[k] for k in keys]).astype(np.float32)


def _load(path: Path) -> dict[str, FloatArray]:
    with np.load(path, allow_pickle=False) as npz:
        return dict(zip(npz["keys"].tolist(), npz["vecs"], strict=True))


def _save(path: Path, cache: dict[str, FloatArray]) -> None:
    """Write `cache` plus whatever another process saved to `path` since this one read it (added to `cache`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.with_suffix(".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if path.exists():
            try:
                for key, vec in _load(path).items():
                    cache.setdefault(key, vec)
            except (OSError, ValueError, KeyError):
                pass  # an unreadable file is replaced by this process's vectors
        tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npz")
        np.savez(tmp, keys=np.asarray(list(cache)), vecs=np.stack(list(cache.values())))
        tmp.replace(path)
