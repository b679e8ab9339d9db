"""Training targets made from real outcomes: what the router learns to predict for each prompt.

All are computed per source from that source's own outcomes (never from a held-out source):

- `pairwise`: `(1 - weak) * strong`, the mean over (micro-class, frontier-class) model pairs of
  "micro wrong and frontier right", straight from the observed outcomes.
- `irt-pairwise`: the same event under a Rasch fit of the source's whole outcome matrix (every model it
  has, up to 60): `(1 - sigmoid(a_micro - d)) * sigmoid(a_frontier - d)` with `d` the prompt's difficulty and
  `a_*` the mean abilities of the two classes. The other models' outcomes denoise the two classes' few.
- `irt-fail`: P(a micro-class model fails) under the same fit, `sigmoid(d - a_micro)`: difficulty measured
  against the micro pool's ability, comparable across sources.
- `gap`: `strong - weak`, the quality gap itself (in [-1, 1]).

A preference source (`SourceSpec.kind == "chat"`: judged pairs, no correctness) gets both IRT targets from
the pairwise fit of its pairs (`preferences.fit_pairwise`): P(a frontier-class answer is preferred to a
micro-class one), the same event in its own terms.

`cascade router eval --target NAME` compares them on leave-one-source-out traffic.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from router_models.training.irt import fit_rasch, sigmoid
from router_models.training.outcomes import SOURCES, Example
from router_models.training.preferences import fit_pairwise, p_preferred

__all__ = ["TARGETS", "targets"]

Floats = npt.NDArray[np.float64]
TARGETS = ("pairwise", "irt-pairwise", "irt-fail", "gap")


def _irt_targets(examples: Sequence[Example], name: str) -> Floats:
    spec = next((s for s in SOURCES if s.name == examples[0].source), None)
    if spec is None:  # a user's or the gateway's labels: no outcome matrix, the observed event itself
        return np.asarray([ex.target for ex in examples], dtype=np.float64)
    models = examples[0].models
    if spec.kind == "chat":
        return _preference_targets(examples, spec.strong_models, spec.weak_models)
    fit = fit_rasch(np.asarray([ex.outcomes for ex in examples], dtype=np.float64))
    weak = float(np.mean([fit.ability[models.index(m)] for m in spec.weak_models if m in models]))
    strong = float(np.mean([fit.ability[models.index(m)] for m in spec.strong_models if m in models]))
    d = fit.difficulty
    if name == "irt-fail":
        return sigmoid(d - weak)
    return (1.0 - sigmoid(weak - d)) * sigmoid(strong - d)


def _preference_targets(examples: Sequence[Example], strong: Sequence[str], weak: Sequence[str]) -> Floats:
    models = examples[0].models
    rows = [(i, w, lo) for i, ex in enumerate(examples) for w, lo in ex.pairs]
    item, winner, loser = zip(*rows, strict=True) if rows else ((), (), ())
    fit = fit_pairwise(len(examples), len(models), item, winner, loser)
    return p_preferred(fit, [models.index(m) for m in strong if m in models],
                       [models.index(m) for m in weak if m in models])


def targets(examples: Sequence[Example], name: str) -> Floats:
    """One target value per example, in order. Raises ValueError for an unknown target name."""
    if name not in TARGETS:
        raise ValueError(f"unknown target {name!r}; choose one of {', '.join(TARGETS)}")
    if name == "pairwise":
        return np.asarray([ex.target for ex in examples], dtype=np.float64)
    if name == "gap":
        return np.asarray([ex.strong - ex.weak for ex in examples], dtype=np.float64)
    out = np.zeros(len(examples), dtype=np.float64)
    for source in dict.fromkeys(ex.source for ex in examples):
        idx = [i for i, ex in enumerate(examples) if ex.source == source]
        out[idx] = _irt_targets([examples[i] for i in idx], name)
    return out
