"""LRU + TTL cache."""

from __future__ import annotations

from router_models.serving.ttl_cache import TTLCache


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_hit_miss_and_ttl() -> None:
    clock = Clock()
    cache: TTLCache[str, float] = TTLCache(10, ttl_s=5.0, clock=clock)
    assert cache.get("a") is None
    cache.put("a", 0.3)
    clock.now = 4.9
    assert cache.get("a") == 0.3
    clock.now = 5.1
    assert cache.get("a") is None
    assert len(cache) == 0
    assert (cache.hits, cache.misses) == (1, 2)


def test_lru_eviction() -> None:
    cache: TTLCache[str, float] = TTLCache(2, ttl_s=60.0)
    cache.put("a", 1.0)
    cache.put("b", 2.0)
    assert cache.get("a") == 1.0  # a is now most recent
    cache.put("c", 3.0)
    assert cache.get("b") is None
    assert cache.get("a") == 1.0
    assert cache.get("c") == 3.0


def test_disabled() -> None:
    cache: TTLCache[str, float] = TTLCache(0, ttl_s=60.0)
    cache.put("a", 1.0)
    assert cache.get("a") is None
