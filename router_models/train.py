"""Offline training of the complexity router (`cascade router train`). Never imported by serving code.

Data: RouteLLM MMLU + GSM8K (weak/strong correctness) and our own labelled chat/code/reasoning/math prompts
(`data/labelled_prompts.jsonl`). A stratified (source x label) held-out split is kept aside; the L2
strength is picked by stratified k-fold CV on the rest (criterion: mean per-source AUC, so no source
dominates), then a standardised logistic regression is fitted and folded into a `LinearRouter`.
"""

from __future__ import annotations

import hashlib
import platform
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from router_models.artifact import RouterArtifact
from router_models.classifier import LinearRouter, feature_matrix
from router_models.data import (
    DEFAULT_ROUTING_DIR,
    PACKAGE_DATA,
    Example,
    data_hash,
    load_jsonl_examples,
    load_routing_examples,
)
from router_models.embedder import Embedder

__all__ = ["SOURCE_WEIGHTS", "TrainConfig", "embed_cached", "fit_router", "load_training_data", "split", "train"]

FloatArray = npt.NDArray[np.float32]
CACHE_DIR = Path(".cascade/router-cache")
# Total training weight per source (normalised to mean 1 per example). Our own labelled prompts stand for
# the chat traffic the gateway actually sees, so they weigh twice as much as both exam sets together.
SOURCE_WEIGHTS = {"mmlu": 1.0, "gsm8k": 1.0, "labelled": 4.0}


@dataclass(frozen=True)
class TrainConfig:
    """What `train` reads and how it fits. `c_grid` is the inverse L2 strengths tried by CV."""

    routing_dir: Path = DEFAULT_ROUTING_DIR
    labelled: Path = PACKAGE_DATA / "labelled_prompts.jsonl"
    holdout: float = 0.2
    folds: int = 5
    c_grid: tuple[float, ...] = (0.01, 0.03, 0.1, 0.3, 1.0)
    seed: int = 0


def load_training_data(cfg: TrainConfig) -> list[Example]:
    """All training-pool examples: MMLU, GSM8K and our labelled prompts (source 'labelled')."""
    return load_routing_examples(cfg.routing_dir) + load_jsonl_examples(cfg.labelled, "labelled")


def split(examples: Sequence[Example], holdout: float, seed: int) -> tuple[list[int], list[int]]:
    """Deterministic stratified (source x label) split: (train indices, held-out indices)."""
    from sklearn.model_selection import train_test_split

    strata = [f"{ex.source}:{ex.label}" for ex in examples]
    train_idx, test_idx = train_test_split(
        list(range(len(examples))), test_size=holdout, random_state=seed, stratify=strata
    )
    return sorted(train_idx), sorted(test_idx)


def embed_cached(embedder: Embedder, texts: Sequence[str], cache_dir: Path = CACHE_DIR) -> FloatArray:
    """Embeddings of `texts`, reusing vectors cached on disk per embedder (keyed by text sha1)."""
    from tqdm import tqdm

    keys = [hashlib.sha1(t.encode()).hexdigest() for t in texts]
    tag = getattr(embedder, "cache_tag", "")  # e.g. the ONNX graph's hash: a re-export must not reuse vectors
    path = cache_dir / f"{embedder.name.replace(':', '_')}{'_' + tag if tag else ''}.npz"
    cache: dict[str, FloatArray] = {}
    if path.exists():
        with np.load(path, allow_pickle=False) as npz:
            cache = dict(zip(npz["keys"].tolist(), npz["vecs"], strict=True))
    missing = sorted({k: t for k, t in zip(keys, texts, strict=True) if k not in cache}.items())
    chunk = 256
    for n, start in enumerate(tqdm(range(0, len(missing), chunk), desc=f"embedding {len(missing)} texts")):
        part = missing[start : start + chunk]
        for (k, _), vec in zip(part, embedder.embed([t for _, t in part]), strict=True):
            cache[k] = vec
        if n % 8 == 7 or start + chunk >= len(missing):  # checkpoint: an interrupted run keeps its work
            _save_cache(path, cache)
    return np.stack([cache[k] for k in keys]).astype(np.float32)


def _save_cache(path: Path, cache: dict[str, FloatArray]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, keys=np.asarray(list(cache)), vecs=np.stack(list(cache.values())))
    tmp.replace(path)


def sample_weights(examples: Sequence[Example]) -> npt.NDArray[np.float64]:
    """Per-example weights giving each source its `SOURCE_WEIGHTS` share; mean weight 1."""
    sources = [ex.source for ex in examples]
    counts = {s: sources.count(s) for s in set(sources)}
    w = np.asarray([SOURCE_WEIGHTS.get(s, 1.0) / counts[s] for s in sources], dtype=np.float64)
    return np.asarray(w * len(w) / w.sum(), dtype=np.float64)


def fit_router(x: FloatArray, y: Sequence[int], weights: npt.NDArray[np.float64], c: float) -> LinearRouter:
    """Standardise, fit an L2 logistic regression with inverse strength `c`, fold into a LinearRouter."""
    from sklearn.linear_model import LogisticRegression

    mean = x.mean(axis=0)
    scale = x.std(axis=0) + 1e-6
    clf = LogisticRegression(C=c, max_iter=2000)
    clf.fit((x - mean) / scale, np.asarray(y), sample_weight=weights)
    return LinearRouter.from_standardised(clf.coef_[0], float(clf.intercept_[0]), mean, scale)


def _per_source_auc(router: LinearRouter, x: FloatArray, examples: Sequence[Example]) -> float:
    from sklearn.metrics import roc_auc_score

    scores = router.predict_proba(x)
    aucs = []
    for source in sorted({ex.source for ex in examples}):
        idx = [i for i, ex in enumerate(examples) if ex.source == source]
        labels = [examples[i].label for i in idx]
        if 0 < sum(labels) < len(labels):
            aucs.append(roc_auc_score(labels, scores[idx]))
    return float(np.mean(aucs))


def choose_c(x: FloatArray, examples: Sequence[Example], cfg: TrainConfig) -> tuple[float, dict[str, float]]:
    """Pick the inverse L2 strength by stratified k-fold CV (mean per-source AUC); returns (best, all)."""
    from sklearn.model_selection import StratifiedKFold
    from tqdm import tqdm

    strata = [f"{ex.source}:{ex.label}" for ex in examples]
    folds = list(StratifiedKFold(cfg.folds, shuffle=True, random_state=cfg.seed).split(x, strata))
    y = [ex.label for ex in examples]
    results: dict[str, float] = {}
    for c in tqdm(cfg.c_grid, desc="cross-validating C", unit="C"):
        scores = []
        for tr, va in folds:
            sub = [examples[i] for i in tr]
            router = fit_router(x[tr], [y[i] for i in tr], sample_weights(sub), c)
            scores.append(_per_source_auc(router, x[va], [examples[i] for i in va]))
        results[str(c)] = float(np.mean(scores))
    best = max(cfg.c_grid, key=lambda c: results[str(c)])
    return best, results


def train(cfg: TrainConfig, embedder: Embedder) -> RouterArtifact:
    """Fit the router on the training split and return it with metadata (held-out metrics added by caller)."""
    examples = load_training_data(cfg)
    train_idx, test_idx = split(examples, cfg.holdout, cfg.seed)
    tr = [examples[i] for i in train_idx]
    x = feature_matrix(embed_cached(embedder, [ex.text for ex in tr]), [ex.text for ex in tr])
    best_c, cv = choose_c(x, tr, cfg)
    router = fit_router(x, [ex.label for ex in tr], sample_weights(tr), best_c)
    metadata: dict[str, Any] = {
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "data_sha256": data_hash(examples),
        "train_examples": len(tr),
        "heldout_examples": len(test_idx),
        "split": {"holdout": cfg.holdout, "seed": cfg.seed, "stratify": "source x label"},
        "source_weights": SOURCE_WEIGHTS,
        "label": "needs_flagship = (not weak_correct) and strong_correct",
        "model": {"type": "standardised L2 logistic regression", "C": best_c, "cv_mean_source_auc": cv},
        "python": platform.python_version(),
    }
    return RouterArtifact(router=router, embedder=embedder.name, metadata=metadata)
