"""Evaluation reports of a trained router (`cascade router eval`, and the metrics stored at train time).

- held-out split, per source and overall: AUC, APGR, CPT(50%), CPT(80%) against random routing;
- the separately written mixed-traffic set (`data/mixed_eval.jsonl`), per kind, and the Spearman
  correlation of scores with the graded math difficulty (1..4) in it;
- cross-source generalisation: fit on one source's training split, evaluate on every other source.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from router_models.artifact import RouterArtifact
from router_models.classifier import LinearRouter, feature_matrix
from router_models.data import PACKAGE_DATA, Example, load_jsonl_examples
from router_models.embedder import Embedder
from router_models.evaluate import metrics, pgr_curve, plot_curves
from router_models.train import TrainConfig, embed_cached, fit_router, load_training_data, sample_weights, split

__all__ = ["MIXED_EVAL", "cross_source_report", "heldout_report", "mixed_report", "score_examples"]

MIXED_EVAL = PACKAGE_DATA / "mixed_eval.jsonl"
Floats = npt.NDArray[np.float64]


def score_examples(router: LinearRouter, embedder: Embedder, examples: Sequence[Example]) -> Floats:
    """Router scores for examples (embeddings cached on disk)."""
    texts = [ex.text for ex in examples]
    return router.predict_proba(feature_matrix(embed_cached(embedder, texts), texts))


def _grouped(examples: Sequence[Example], scores: Floats, key: str) -> dict[str, dict[str, float | int]]:
    groups: dict[str, list[int]] = {"all": list(range(len(examples)))}
    for i, ex in enumerate(examples):
        groups.setdefault(str(getattr(ex, key)), []).append(i)
    out = {}
    for name, idx in sorted(groups.items()):
        sub = [examples[i] for i in idx]
        out[name] = metrics(
            scores[idx], [e.label for e in sub], [e.weak for e in sub], [e.strong for e in sub]
        ).as_dict()
    return out


def _curve(examples: Sequence[Example], scores: Floats) -> tuple[Floats, Floats]:
    return pgr_curve(scores, [e.weak for e in examples], [e.strong for e in examples])


def heldout_report(
    art: RouterArtifact, embedder: Embedder, cfg: TrainConfig, plot: Path | None = None
) -> dict[str, Any]:
    """Metrics per source on the held-out split `train` kept aside (same data, seed and fraction)."""
    examples = load_training_data(cfg)
    _, test_idx = split(examples, cfg.holdout, cfg.seed)
    test = [examples[i] for i in test_idx]
    scores = score_examples(art.router, embedder, test)
    if plot is not None:
        curves = {s: _curve([e for e in test if e.source == s], scores[[e.source == s for e in test]])
                  for s in sorted({e.source for e in test})}
        plot_curves(curves, plot, "router on the held-out split")
    return _grouped(test, scores, "source")


def mixed_report(
    art: RouterArtifact, embedder: Embedder, path: Path = MIXED_EVAL, plot: Path | None = None
) -> dict[str, Any]:
    """Metrics per kind on the mixed-traffic set, plus Spearman(score, difficulty) on its math ladder."""
    from scipy.stats import spearmanr

    examples = load_jsonl_examples(path, "mixed")
    scores = score_examples(art.router, embedder, examples)
    report: dict[str, Any] = {"by_kind": _grouped(examples, scores, "group")}
    math_idx = [i for i, e in enumerate(examples) if e.difficulty > 0]
    rho = spearmanr([examples[i].difficulty for i in math_idx], scores[math_idx]).statistic
    report["math_spearman"] = round(float(rho), 4)
    report["math_mean_score_by_difficulty"] = {
        str(d): round(float(np.mean([scores[i] for i in math_idx if examples[i].difficulty == d])), 4)
        for d in sorted({examples[i].difficulty for i in math_idx})
    }
    if plot is not None:
        plot_curves({"mixed traffic": _curve(examples, scores)}, plot, "router on held-out mixed traffic")
    return report


def cross_source_report(embedder: Embedder, cfg: TrainConfig, c: float) -> dict[str, dict[str, float]]:
    """APGR/AUC when fitting on one source's training split only, evaluated on each source's held-out
    split and on the mixed set: {train_source: {eval_source: apgr}} plus AUC under 'auc:<eval_source>'."""
    examples = load_training_data(cfg)
    train_idx, test_idx = split(examples, cfg.holdout, cfg.seed)
    mixed = load_jsonl_examples(MIXED_EVAL, "mixed")
    evals = {s: [examples[i] for i in test_idx if examples[i].source == s] for s in SOURCES}
    evals["mixed"] = mixed
    out: dict[str, dict[str, float]] = {}
    for source in SOURCES:
        tr = [examples[i] for i in train_idx if examples[i].source == source]
        texts = [e.text for e in tr]
        router = fit_router(feature_matrix(embed_cached(embedder, texts), texts), [e.label for e in tr],
                            sample_weights(tr), c)
        row: dict[str, float] = {}
        for name, ev in evals.items():
            m = metrics(score_examples(router, embedder, ev), [e.label for e in ev],
                        [e.weak for e in ev], [e.strong for e in ev])
            row[name], row[f"auc:{name}"] = round(m.apgr, 4), round(m.auc, 4)
        out[source] = row
    return out


SOURCES = ("mmlu", "gsm8k", "labelled")
