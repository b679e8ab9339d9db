"""The shipped artifact with the real embedder: obviously easy prompts score below obviously hard ones."""

from __future__ import annotations

import os

from router_models.scorer import conversation_text
from router_models.serving import BatchingConfig, load_scorer

EASY = [
    "hi there!",
    "thanks, that's all",
    "Translate to French: good morning",
    "Classify the sentiment of this review: 'Great product, works fine.'",
    "Extract the date from: 'See you on 12 June.'",
]
HARD = [
    "Prove that there are infinitely many primes p such that p + 2 is not prime, and give a rigorous argument.",
    "Design a multi-region, exactly-once payment processing system with a 99.99% SLO; discuss consistency, "
    "failure modes and the data model, then implement the idempotency layer in Go.",
    "Our service deadlocks under load about once a day. Walk through a root-cause analysis step by step "
    "and propose a fix that keeps latency under 50 ms.",
    "Find all functions f: R -> R such that f(x + f(y)) = f(x) + y for all real x and y.",
]




async def test_easy_below_hard() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    scorer = load_scorer(config=BatchingConfig(max_wait_ms=2), torch_threads=1)
    try:
        easy = await scorer.score(EASY)
        hard = await scorer.score(HARD)
        chat = await scorer.score([conversation_text([{"role": "user", "content": "hello, how are you?"}])])
    finally:
        await scorer.aclose()
    assert all(0.0 <= s <= 1.0 for s in easy + hard)
    assert max(easy) < min(hard), (easy, hard)
    assert chat[0] < 0.5
