"""The response cache's Redis operations: read an entry, keep one within the tenant's bounds, read and prune the
semantic rows. Every call fails open: Redis down, erring or slower than `op_timeout_s` raises `CacheUnavailable`
at once (and for the next `retry_interval_s` without asking Redis again: `gateway.tenancy.limits.FailOpen`), and
the caller serves the request without the cache.

Bounds, each applied atomically by one script when an answer is kept: an exact entry lives `ttl_s` and the
tenant keeps at most `max_entries` of them (a sorted set by store time; the oldest go first); a semantic entry
lives `ttl_s`, and the tenant keeps at most `max_entries` rows per model and vector space (entry ids sort by store
time; the oldest go first, with their entries). A row whose entry expired stays until the bound or a lookup that
finds it drops it; lookups skip rows older than the TTL.

The Redis client is borrowed (the caller owns and closes it).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from redis.asyncio import Redis

from gateway.tenancy.limits import FailOpen

__all__ = ["CacheUnavailable", "RedisCacheStore"]

T = TypeVar("T")

# KEYS: entry, index. ARGV: value, ttl_s, max entries, now ms, digest, entry key prefix
_KEEP_EXACT = """#!lua
local ttl_ms = tonumber(ARGV[2]) * 1000
redis.call('SET', KEYS[1], ARGV[1], 'PX', ttl_ms)
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[5])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', string.format('%d', tonumber(ARGV[4]) - ttl_ms))
local over = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[3])
if over > 0 then
  local old = redis.call('ZPOPMIN', KEYS[2], over)
  for i = 1, #old, 2 do redis.call('DEL', ARGV[6] .. old[i]) end
end
redis.call('PEXPIRE', KEYS[2], ttl_ms)
return over
"""

# KEYS: vector hash, entry. ARGV: entry id, row, value, ttl_s, max rows, entry key prefix
_KEEP_SEMANTIC = """#!lua
redis.call('SET', KEYS[2], ARGV[3], 'EX', ARGV[4])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[4])
local over = redis.call('HLEN', KEYS[1]) - tonumber(ARGV[5])
if over > 0 then
  local fields = redis.call('HKEYS', KEYS[1])
  table.sort(fields)
  for i = 1, over do
    redis.call('HDEL', KEYS[1], fields[i])
    redis.call('DEL', ARGV[6] .. fields[i])
  end
end
return over
"""


class CacheUnavailable(Exception):
    """Redis could not be asked (down, erring, slow, or skipped after a recent failure): bypass the cache."""


class RedisCacheStore:
    """See the module docstring. `op_timeout_s` bounds each call, waiting for a connection slot included."""

    def __init__(self, client: Redis, *, op_timeout_s: float = 0.1, retry_interval_s: float = 1.0,
                 max_in_flight: int = 64) -> None:
        self._client = client
        self._guard = FailOpen("response cache", op_timeout_s=op_timeout_s, max_in_flight=max_in_flight,
                               retry_interval_s=retry_interval_s)
        self._keep_exact = client.register_script(_KEEP_EXACT)
        self._keep_semantic = client.register_script(_KEEP_SEMANTIC)

    async def _call(self, fn: Callable[[], Awaitable[T]]) -> T:
        async def boxed() -> tuple[T]:
            return (await fn(),)

        result = await self._guard.call(boxed)
        if result is None:
            raise CacheUnavailable
        return result[0]

    async def get(self, key: str) -> bytes | None:
        value: Any = await self._call(lambda: self._client.get(key))
        return None if value is None else bytes(value)

    async def drop(self, key: str, vectors: str | None = None, field: bytes | None = None) -> None:
        """Delete an entry (and its semantic row): a corrupt or stale one."""
        async def run() -> None:
            async with self._client.pipeline(transaction=False) as pipe:
                pipe.delete(key)
                if vectors is not None and field is not None:
                    pipe.hdel(vectors, field)
                await pipe.execute()

        await self._call(run)

    async def keep_exact(self, key: str, index: str, digest: str, value: bytes, ttl_s: int, max_entries: int,
                         entry_prefix: str) -> None:
        now_ms = int(time.time() * 1000)
        await self._call(lambda: self._keep_exact(keys=[key, index], args=[value, ttl_s, max_entries, now_ms, digest,
                                                                           entry_prefix]))

    async def rows(self, vectors: str) -> dict[bytes, bytes]:
        """The semantic rows of one tenant, model and vector space: entry id -> row."""
        raw: Any = await self._call(lambda: self._client.hgetall(vectors))
        return {bytes(k): bytes(v) for k, v in raw.items()}

    async def keep_semantic(self, vectors: str, key: str, entry_id: str, row: bytes, value: bytes, ttl_s: int,
                            max_rows: int, entry_prefix: str) -> None:
        await self._call(lambda: self._keep_semantic(keys=[vectors, key], args=[entry_id, row, value, ttl_s, max_rows,
                                                                                entry_prefix]))
