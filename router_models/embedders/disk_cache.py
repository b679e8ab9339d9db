"""Embeddings of training and evaluation texts, cached on disk per embedder so re-runs skip the model.

The cache file is keyed by the embedder's name and `cache_tag` (e.g. the ONNX graph's hash, so a re-export
never reuses stale vectors); entries by the sha1 of the text. Checkpointed every few thousand texts, so an
interrupted run keeps its work. Offline tooling only: serving never reads it.
"""

from __future__ import annotations

import hashlib
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
        with np.load(path, allow_pickle=False) as npz:
            cache = dict(zip(npz["keys"].tolist(), npz["vecs"], strict=True))
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


def _save(path: Path, cache: dict[str, FloatArray]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, keys=np.asarray(list(cache)), vecs=np.stack(list(cache.values())))
    tmp.replace(path)
