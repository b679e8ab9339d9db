"""A small LRU cache whose entries also expire after a fixed time-to-live. Not thread-safe: owned by one
event loop (the scorer touches it only from coroutines)."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["TTLCache"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class TTLCache(Generic[K, V]):
    """Maps K -> V (the scorer's: scores by (text, conversation shape), and the embeddings behind them by text).
    At most `max_entries` (least recently used evicted first); an entry older than `ttl_s` seconds (by `clock`,
    monotonic by default) is a miss. `max_entries=0` disables caching."""

    def __init__(self, max_entries: int, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._max = max_entries
        self._ttl = ttl_s
        self._clock = clock
        self._data: OrderedDict[K, tuple[float, V]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._data)

    def get(self, key: K) -> V | None:
        """The cached value, or None when absent or expired (expired entries are dropped)."""
        item = self._data.get(key)
        if item is None or self._clock() - item[0] > self._ttl:
            if item is not None:
                del self._data[key]
            self.misses += 1
            return None
        self._data.move_to_end(key)
        self.hits += 1
        return item[1]

    def peek(self, key: K) -> V | None:
        """Like `get`, without counting a hit or a miss (a second reader of what `get` already counted)."""
        item = self._data.get(key)
        if item is None or self._clock() - item[0] > self._ttl:
            return None
        return item[1]

    def clear(self) -> None:
        """Drop every entry (the counters stay)."""
        self._data.clear()

    def put(self, key: K, value: V) -> None:
        """Insert or refresh `key`; evicts the least recently used entries beyond `max_entries`."""
        if self._max <= 0:
            return
        self._data[key] = (self._clock(), value)
        self._data.move_to_end(key)
        while len(self._data) > self._max:
            self._data.popitem(last=False)
