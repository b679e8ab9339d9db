"""Python's cyclic garbage collector in a long-running gateway: its pauses measured, the long-lived heap kept out.

Why this exists: a gateway process holds a large heap that lives as long as it does (torch, the embedding model
and its tokenizer, scikit-learn's tables, the policy, compiled regexes): several hundred thousand tracked objects.
Each full (generation 2) collection walks all of them while the event loop is held, so every request in flight
waits: at saturation those pauses were the p99 (8-18x the p50; with the collector off p99 fell about 10x).
`freeze_heap()` moves everything alive at that moment into the permanent generation (`gc.freeze`): later
collections walk only what requests create, and since the young generations are what requests fill, the
pauses shrink to what a request's own garbage costs.

When it is called: once start-up is done (models, tokenizers, policy loaded), and after each policy or router
swap. A swap drops the old policy or router: objects in the permanent generation are never collected, so a frozen
old router in a reference cycle would leak. `freeze_heap()` therefore unfreezes, runs one full collection (the
one pause a swap costs, logged with its length) and freezes what is left.

`GcPauses` records every collection's generation, pause and the unreachable objects it freed through
`gc.callbacks`, for the `cascade_gc_pause_seconds{generation}` histogram, the
`cascade_gc_collected_objects_total{generation}` counter (objects only the cyclic collector could free: reference
cycles; per request, near 0 is what a request path without cycles gives) and the tail benchmark. A callback runs
inside the collector, on whichever thread triggered it; it only reads the clock and calls `observe`.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from typing import Any

__all__ = ["GcPauses", "freeze_heap"]

log = logging.getLogger(__name__)


def freeze_heap(why: str) -> None:
    """Collect what is garbage now, then move every object still alive to the permanent generation."""
    started = time.perf_counter()
    gc.unfreeze()  # the previous freeze's objects back in generation 2, so the swapped-out ones can go
    freed = gc.collect()
    gc.freeze()
    log.info("heap frozen out of the cyclic collector", extra={
        "why": why, "frozen_objects": gc.get_freeze_count(), "freed_objects": freed,
        "pause_ms": round(1000 * (time.perf_counter() - started), 1)})


class GcPauses:
    """Calls `observe(generation, seconds, collected)` after each collection; `install` / `uninstall` own the
    callback."""

    def __init__(self, observe: Callable[[int, float, int], None]) -> None:
        self._observe = observe
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started:
            self._observe(int(info["generation"]), time.perf_counter() - self._started, int(info["collected"]))
            self._started = 0.0

    def install(self) -> None:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def uninstall(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)
