"""Building the in-domain reference: folds leave each source out, the calibration rises and spreads held-out
traffic below in-sample traffic, and the build refuses what it cannot calibrate.

The vectors here are made up (clusters in a few directions): they test the arithmetic, never a claim about real
traffic. The figures on real data are the shipped reference's (`test_domain.py`, MODEL_CARD.md)."""

from __future__ import annotations

import numpy as np
import pytest

from router_models.training.domain_build import BOUNDS, build_domain, evenly
from router_models.training.outcomes import Example


def _examples(sources: dict[str, int], per_source: int = 60, seed: int = 0) -> tuple[np.ndarray, list[Example]]:
    """Each source a cluster around its own direction (its index in an 8-d space); `sources` maps a name to it."""
    rng = np.random.default_rng(seed)
    rows, examples = [], []
    for name, axis in sources.items():
        centre = np.zeros(8)
        centre[axis] = 1.0
        for k in range(per_source):
            rows.append(centre + 0.35 * rng.standard_normal(8))
            examples.append(Example(f"{name} {k}", name, "g", 0.5, 0.5, f"{name}-{k}"))
    return np.asarray(rows, np.float32), examples


def test_evenly_keeps_the_ends_and_never_more_than_asked() -> None:
    assert evenly([1, 2, 3], 5) == [1, 2, 3]
    assert evenly(list(range(10)), 3) == [0, 4, 9]


def test_held_out_sources_score_below_in_sample_traffic() -> None:
    # two sources share a direction (as MMLU and MMLU-Pro share subjects), one stands apart (as chat does)
    x, examples = _examples({"exam-a": 0, "exam-b": 0, "exam-c": 1, "chat": 5})
    reference, report = build_domain(x, examples, per_source=20, neighbours=3, probes=40)
    assert reference.rows.shape == (80, 8) and reference.sources == ("exam-a", "exam-b", "exam-c", "chat")
    assert np.all(np.diff(reference.knots) > 0) and reference.levels[0] == 0.0 and reference.levels[-1] == 1.0
    held = report.held_out
    # a source held out whose kind another source covers reads as in-domain; one of its own kind does not
    assert max(held["chat"]["mean"], held["exam-c"]["mean"]) < 0.3 < 0.5 < held["exam-a"]["mean"]
    assert held["chat"]["mean"] < report.in_sample["mean"]
    assert held["chat"]["below"][str(BOUNDS[2])] > report.in_sample["below"][str(BOUNDS[2])]
    assert 0.5 < report.auc <= 1.0
    assert any("chat held out" in line for line in report.lines())


def test_copies_of_a_held_out_prompt_are_kept_out_of_its_fold() -> None:
    x, examples = _examples({"a": 0, "b": 1, "c": 2}, per_source=30)
    # every prompt of "a" also appears in "b" (same key, same vector): without the rule "a" would look in-domain
    copies = [Example(ex.text, "b", "g", 0.5, 0.5, ex.key) for ex in examples if ex.source == "a"]
    rows = np.vstack([x, x[: len(copies)]])
    _, report = build_domain(rows, [*examples, *copies], per_source=10, neighbours=1, probes=30)
    assert report.held_out["a"]["mean"] < report.in_sample["mean"]


def test_one_source_cannot_be_left_out() -> None:
    x, examples = _examples({"only": 0})
    with pytest.raises(ValueError, match="two sources or more"):
        build_domain(x, examples)
