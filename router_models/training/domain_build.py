"""Build the router's in-domain reference and fit its calibration leave-one-source-out
(`cascade router domain build`; the reference: `router_models.serving.domain`).

Per public source S (a fold): the reference is `per_source` prompts of every other source (evenly spaced, no
copy of an S prompt: same `prompt_key`), the held-out probes are up to `probes` of S's prompts, the in-sample
probes up to `probes` prompts of the other sources that are not in the reference (nor copies of one). Their
similarities (`DomainReference.similarity`) are pooled over the folds, every fold's two sides weighing the same,
and their weighted distribution function, read at `KNOTS` + 1 evenly spaced levels, is the calibration: monotone
by construction. The served reference is the same sample over every source. Deterministic: evenly spaced picks,
no random state.

`DomainReport` keeps what the folds gave (per held-out source: quantiles of its in-domain figures, its mean, the
share below each bound; the same for the in-sample probes; the AUC of in sample against held out): stored in the
reference's metadata and printed, the figures MODEL_CARD.md quotes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from router_models.serving.domain import DomainReference, unit_rows
from router_models.training.outcomes import Example

__all__ = ["BOUNDS", "DomainReport", "build_domain", "evenly"]

Floats = npt.NDArray[np.float64]
BOUNDS = (0.1, 0.2, 0.3, 0.4, 0.5)
KNOTS = 40  # intervals of the calibration's piecewise-linear table
_QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)


def evenly(indices: Sequence[int], limit: int) -> list[int]:
    """At most `limit` of `indices`, evenly spaced (all of them when there are no more)."""
    if len(indices) <= limit:
        return list(indices)
    picks = np.linspace(0, len(indices) - 1, limit).round().astype(int)
    return [indices[i] for i in picks]


@dataclass(frozen=True)
class DomainReport:
    """The leave-one-source-out figures of a calibration: `held_out[S]` for S's prompts against a reference of
    the others, `in_sample` for the other sources' probes pooled over the folds; `auc` separates the two."""

    held_out: dict[str, dict[str, Any]]
    in_sample: dict[str, Any]
    auc: float

    def as_dict(self) -> dict[str, Any]:
        return {"held_out": self.held_out, "in_sample": self.in_sample, "auc": round(self.auc, 4),
                "bounds": list(BOUNDS)}

    def lines(self) -> list[str]:
        head = f"{'':<30}{'n':>7}{'mean':>7}" + "".join(f"{'q' + str(int(q * 100)):>7}" for q in _QUANTILES)
        head += "".join(f"{'<' + str(b):>7}" for b in BOUNDS)
        out = [head]
        for name, row in [*((f"{s} held out", r) for s, r in self.held_out.items()), ("in sample", self.in_sample)]:
            out.append(f"{name:<30}{row['n']:>7}{row['mean']:>7.3f}" + "".join(f"{v:>7.3f}" for v in row["quantiles"])
                       + "".join(f"{row['below'][str(b)]:>7.3f}" for b in BOUNDS))
        out.append(f"AUC, in sample against held out: {self.auc:.3f}")
        return out


def _summary(figures: Floats) -> dict[str, Any]:
    return {"n": len(figures), "mean": round(float(figures.mean()), 4),
            "quantiles": [round(float(q), 4) for q in np.quantile(figures, _QUANTILES)],
            "below": {str(b): round(float(np.mean(figures < b)), 4) for b in BOUNDS}}


def _auc(positives: Floats, negatives: Floats) -> float:
    """P(a positive's value > a negative's), ties counting half."""
    from sklearn.metrics import roc_auc_score

    labels = np.concatenate([np.ones(len(positives)), np.zeros(len(negatives))])
    return float(roc_auc_score(labels, np.concatenate([positives, negatives])))


def _distribution_knots(values: Floats, weights: Floats) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(knots, levels) of the weighted distribution function of `values`: the value below which each of `KNOTS` + 1
    evenly spaced shares of the weight lies (ties merged, so the knots rise strictly)."""
    order = np.argsort(values, kind="mergesort")
    v, cum = values[order], np.cumsum(weights[order]) / weights.sum()
    levels = np.linspace(0.0, 1.0, KNOTS + 1)
    knots = np.interp(levels, np.concatenate([[0.0], cum]), np.concatenate([[v[0]], v]))
    keep = np.concatenate([[True], np.diff(knots) > 1e-9])
    if keep.sum() < 2:
        raise ValueError("the in-domain calibration found one similarity for every prompt: nothing to tell apart")
    return tuple(round(float(k), 6) for k in knots[keep]), tuple(round(float(lv), 4) for lv in levels[keep])


def _reference_rows(examples: Sequence[Example], allowed: Sequence[int], per_source: int) -> list[int]:
    """`per_source` evenly spaced rows of each source among `allowed`, one per prompt key."""
    by_source: dict[str, list[int]] = {}
    seen: set[str] = set()
    for i in allowed:
        if examples[i].key not in seen:
            seen.add(examples[i].key)
            by_source.setdefault(examples[i].source, []).append(i)
    return [i for rows in by_source.values() for i in evenly(rows, per_source)]


def _fold(x: npt.NDArray[np.float32], examples: Sequence[Example], source: str, per_source: int,
          neighbours: int, probes: int) -> tuple[Floats, Floats]:
    """(held-out similarities of `source`, in-sample similarities of the other sources) for one fold."""
    held_keys = {ex.key for ex in examples if ex.source == source}
    others = [i for i, ex in enumerate(examples) if ex.source != source and ex.key not in held_keys]
    ref = _reference_rows(examples, others, per_source)
    ref_keys = {examples[i].key for i in ref}
    fold = DomainReference(x[ref].astype(np.float16), neighbours, (0.0, 1.0), (0.0, 1.0))
    held = evenly([i for i, ex in enumerate(examples) if ex.source == source], probes)
    rest: dict[str, list[int]] = {}
    for i in others:
        if examples[i].key not in ref_keys:
            rest.setdefault(examples[i].source, []).append(i)
    inside = [i for rows in rest.values() for i in evenly(rows, max(1, probes // len(rest)))]
    return fold.similarity(x[held]), fold.similarity(x[inside])


def build_domain(embeddings: npt.NDArray[np.floating], examples: Sequence[Example], per_source: int = 300,
                 neighbours: int = 10, probes: int = 2000) -> tuple[DomainReference, DomainReport]:
    """The served reference over every source and its leave-one-source-out calibration (module docstring).
    `embeddings` row i is the router's embedding of examples[i].text. Raises ValueError with fewer than two
    sources or a calibration that does not rise with the similarity."""
    x = unit_rows(embeddings)
    sources = list(dict.fromkeys(ex.source for ex in examples))
    if len(sources) < 2:
        raise ValueError(f"the calibration leaves one source out: it needs two sources or more, got {sources}")
    folds = {s: _fold(x, examples, s, per_source, neighbours, probes) for s in sources}
    sims = np.concatenate([np.concatenate([h, i]) for h, i in folds.values()])
    weights = np.concatenate([np.concatenate([np.full(len(h), 1 / len(h)), np.full(len(i), 1 / len(i))])
                              for h, i in folds.values()])
    knots, levels = _distribution_knots(sims, weights)
    served = DomainReference(x[_reference_rows(examples, range(len(examples)), per_source)].astype(np.float16),
                             neighbours, knots, levels, tuple(sources))
    held_out = {s: _summary(served.calibrate(h)) for s, (h, _) in folds.items()}
    inside = np.concatenate([served.calibrate(i) for _, i in folds.values()])
    auc = float(np.mean([_auc(i, h) for h, i in folds.values()]))
    return served, DomainReport(held_out, _summary(inside), auc)


def run_domain_build(artifact: str | None, routing_dir: Any, out: Any = None, per_source: int = 300,
                     neighbours: int = 10, probes: int = 2000, max_per_source: int | None = None) -> int:
    """`cascade router domain build`: embed the artifact's public sources with its embedder (cached), build and
    calibrate the reference, write it beside the artifact (or at `out`) and print the leave-one-source-out
    figures. Returns 0; raises `ArtifactError` / ValueError / FileNotFoundError for the CLI to report."""
    from pathlib import Path

    from router_models.embedders.disk_cache import embed_cached
    from router_models.embedders.factory import make_embedder
    from router_models.serving.artifact import DEFAULT_ARTIFACT, current_artifact_path, load_artifact
    from router_models.serving.domain_file import domain_path, save_domain
    from router_models.training.outcomes import SOURCES, load_outcomes

    named = Path(artifact) if artifact is not None else current_artifact_path()
    meta_path = (named / DEFAULT_ARTIFACT.name if named.is_dir() else named).with_suffix(".json")
    art = load_artifact(meta_path)
    known = {s.name for s in SOURCES}
    sources = tuple(s for s in art.metadata.get("sources", {}) if s in known) or None
    examples = load_outcomes(Path(routing_dir), sources=sources, max_per_source=max_per_source)
    embedder = make_embedder(art.embedder)
    print(f"[domain] embedding {len(examples)} prompts of {len(set(e.source for e in examples))} sources with "
          f"{embedder.name} (cached after the first run)")
    x = embed_cached(embedder, [ex.text for ex in examples])
    reference, report = build_domain(x, examples, per_source, neighbours, probes)
    print("[domain] in-domain figure, leave one source out (quantiles; share below each bound):")
    for line in report.lines():
        print("  " + line)
    target = Path(out) if out is not None else domain_path(meta_path)
    extra = {"artifact": meta_path.name, "per_source": per_source, "probes": probes,
             "calibration": report.as_dict()}
    written = save_domain(reference, target, embedder.name, extra)
    print(f"[domain] wrote {written} ({reference.rows.shape[0]} reference rows, {reference.neighbours} neighbours, "
          f"{len(reference.knots)} calibration knots)")
    return 0
