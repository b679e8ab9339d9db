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

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["GcMetrics", "GcPauses", "freeze_heap"]

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


class GcMetrics:
    """The collector's metrics in a gateway's registry: `paused` is `GcPauses`' observer; `publish` (at scrape
    time) sets the frozen count."""

    def __init__(self, registry: CollectorRegistry) -> None:
        pause = Histogram("cascade_gc_pause_seconds", "how long each cyclic garbage collection held this process, by "
                          "generation: 2 is the full one", ["generation"], registry=registry,
                          buckets=(0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1))
        collected = Counter("cascade_gc_collected_objects", "unreachable objects the cyclic collector freed "
                            "(reference cycles), by generation", ["generation"], registry=registry)
        self._frozen = Gauge("cascade_gc_frozen_objects", "objects frozen out of the cyclic collector (0: nothing "
                             "frozen, --no-gc-freeze or an app embedded in another process)", registry=registry,
                             multiprocess_mode="livemax")
        self._observe = tuple(pause.labels(str(generation)).observe for generation in range(3))
        self._count = tuple(collected.labels(str(generation)).inc for generation in range(3))

    def paused(self, generation: int, seconds: float, collected: int = 0) -> None:
        """One collection of `generation` held this process `seconds` and freed `collected` unreachable objects."""
        self._observe[generation](seconds)
        if collected:
            self._count[generation](collected)

    def publish(self) -> None:
        self._frozen.set(gc.get_freeze_count())
