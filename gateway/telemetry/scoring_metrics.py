"""What the router's scorer cut of what it scored, in `/metrics` (beside `metrics.GatewayMetrics`: that module is
full).

`cascade_router_truncated_total{what}`: "chars", requests whose scoring text reached the 2,000 characters the router
was trained on (`router_models.serving.scorer.SCORING_CHARS`: a longer prompt or conversation is scored on its
first 2,000, latest turn first); "tokens", texts the embedder read only the first 64 word pieces of (its training
limit; counted when embedded, so not again for a cached score). Both are the scorer's counts
(`ClassifierScorer.truncated`), told as they happen (`on_truncated`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter

__all__ = ["truncation_counter"]

_COUNTERS: weakref.WeakKeyDictionary[CollectorRegistry, Counter] = weakref.WeakKeyDictionary()


def truncation_counter(registry: CollectorRegistry) -> Callable[[str, int], None]:
    """`(what, texts)` -> counted in `registry`'s `cascade_router_truncated_total{what}` (made once per registry, so
    a scorer swapped in counts on the same series)."""
    counter = _COUNTERS.get(registry)
    if counter is None:
        counter = Counter("cascade_router_truncated", "scored texts cut as the router's training cut them, by what: "
                          "chars (the scoring text at 2,000 characters), tokens (the embedder's 64 word pieces)",
                          ["what"], registry=registry)
        _COUNTERS[registry] = counter
    found = counter

    def count(what: str, texts: int) -> None:
        found.labels(what).inc(texts)

    return count
