"""The shipped artifact with the real embedder: scoring runs (smoke test on prompts written here), and on real
prompts with real model outcomes it ranks them better than random routing."""

from __future__ import annotations

import os

import numpy as np
import pytest

from router_models.serving.artifact import DEFAULT_ARTIFACT
from router_models.serving.classifier_scorer import BatchingConfig, load_scorer
from router_models.serving.scorer import conversation_text
from router_models.training.evaluate import metrics
from router_models.training.outcomes import DEFAULT_ROUTING_DIR, load_outcomes

# Written here, without outcomes: they only show that scoring runs, never which prompt is harder.
SMOKE_PROMPTS = [
    "hi there!",
    "Translate to French: good morning",
    "Extract the date from: 'See you on 12 June.'",
    "Prove that there are infinitely many primes p such that p + 2 is not prime.",
    "Design a multi-region, exactly-once payment processing system with a 99.99% SLO; discuss consistency, "
    "failure modes and the data model, then implement the idempotency layer in Go.",
    conversation_text([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello, how are you?"}]),
]


async def _scores(texts: list[str]) -> list[float]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    scorer = load_scorer(str(DEFAULT_ARTIFACT), config=BatchingConfig(max_wait_ms=2), torch_threads=1)
    try:
        return list(await scorer.score(texts))
    finally:
        await scorer.aclose()


async def test_scoring_smoke_is_finite_bounded_and_deterministic() -> None:
    first = await _scores(SMOKE_PROMPTS)
    second = await _scores(list(reversed(SMOKE_PROMPTS)))
    assert len(first) == len(SMOKE_PROMPTS)
    assert all(np.isfinite(s) and 0.0 <= s <= 1.0 for s in first), first
    assert list(reversed(second)) == pytest.approx(first, abs=1e-6)  # same text, same score, whatever the batch
    assert len(set(round(s, 6) for s in first)) > 1  # not a constant


@pytest.mark.skipif(not DEFAULT_ROUTING_DIR.is_dir(),
                    reason=f"shared routing data not found at {DEFAULT_ROUTING_DIR} (set CASCADE_ROUTING_DATA)")
async def test_real_prompts_rank_better_than_random_routing() -> None:
    """In-sample regression guard, not a quality figure: the shipped artifact was trained on every source, so
    this sample (50 evenly spaced prompts per source, 350 in all: AUC 0.60, APGR 0.57 when written; 100 per
    source gave 0.64 and 0.61 for twice the scoring time) was seen in training. It catches a scorer that
    serves a different model than the one trained (features, embedder, truncation), which drops to ~0.5.
    The held-out figures are the artifact's leave-one-source-out evaluation (`test_artifact.py`)."""
    sample = load_outcomes(max_per_source=50)
    assert len({ex.source for ex in sample}) >= 2 and len(sample) >= 300
    scores = await _scores([ex.text for ex in sample])
    m = metrics(scores, [ex.label for ex in sample], [ex.weak for ex in sample], [ex.strong for ex in sample],
                [ex.target for ex in sample])
    assert m.apgr > 0.5, m
    assert m.auc > 0.5, m
