"""The collector's pauses are recorded per generation, and freezing the heap keeps what lives long out of later
collections without keeping what a swap dropped."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from gateway.telemetry.gc_pauses import GcPauses, freeze_heap
from gateway.telemetry.metrics import GatewayMetrics


@pytest.fixture
def unfrozen() -> Iterator[None]:
    """This test process's heap as it was: whatever a test froze goes back to the collector."""
    yield
    gc.unfreeze()


class _Node:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


def test_each_collection_is_observed_with_its_generation_pause_and_freed_cycles() -> None:
    seen: list[tuple[int, float, int]] = []
    pauses = GcPauses(lambda generation, seconds, collected: seen.append((generation, seconds, collected)))
    pauses.install()
    pauses.install()  # idempotent: one callback, not two
    try:
        gc.collect(0)
        _Node()  # a cycle nothing refers to: only the collector frees it
        gc.collect(2)
    finally:
        pauses.uninstall()
    gc.collect(1)  # after uninstall: not observed
    assert [generation for generation, _, _ in seen] == [0, 2]
    assert all(0.0 <= seconds < 5.0 for _, seconds, _ in seen)
    assert seen[1][2] >= 1


def test_the_pause_histogram_is_exported_per_generation() -> None:
    metrics = GatewayMetrics(lambda: {})
    pauses = GcPauses(metrics.gc.paused)
    pauses.install()
    try:
        gc.collect(2)
    finally:
        pauses.uninstall()
    text = metrics.render().decode()
    assert 'cascade_gc_pause_seconds_count{generation="2"} 1.0' in text
    assert 'cascade_gc_pause_seconds_count{generation="0"} 0.0' in text
    metrics.gc.paused(0, 0.001, 7)
    assert 'cascade_gc_collected_objects_total{generation="0"} 7.0' in metrics.render().decode()


def test_freezing_keeps_live_objects_out_and_a_later_freeze_frees_what_was_dropped(unfrozen: None) -> None:
    old = _Node()
    dropped = weakref.ref(old)
    freeze_heap("test start-up")
    assert gc.get_freeze_count() > 0
    assert not any(o is old for o in gc.get_objects(2))  # frozen: no collection walks it
    del old
    gc.collect()
    assert dropped() is not None  # a frozen cycle is not collected...
    freeze_heap("test swap")
    assert dropped() is None  # ...until the next freeze collects before it freezes again


def test_the_frozen_gauge_reads_the_collectors_freeze_count(unfrozen: None) -> None:
    metrics = GatewayMetrics(lambda: {})
    gc.unfreeze()
    assert "cascade_gc_frozen_objects 0.0" in metrics.render().decode()
    freeze_heap("test")
    # a frozen object that is freed leaves the count (under coverage's tracer some were, between the scrape and
    # the read after it: 689,755 against 689,752), so the gauge lies between the counts read around the scrape
    before = gc.get_freeze_count()
    line = next(x for x in metrics.render().decode().splitlines() if x.startswith("cascade_gc_frozen_objects "))
    after = gc.get_freeze_count()
    assert before >= float(line.split()[1]) >= after > 0
