"""Batches and files in Redis: their objects, each tenant's index of them, the lines' answers and the batches open.

Keys (`{prefix}{batches}:...`: one hash tag, so that every script and multi-key call also runs on Redis Cluster):
`file:<id>` and `batch:<id>` (hashes: the objects' fields), `batches:<tenant>` (sorted set of the tenant's batch ids by
creation time), `answers:<batch id>` (hash: line index -> its output line), `open` (set of the batch ids workers
serve: in progress or cancelling), `validating` (sorted set of the batches being validated, by start time: one whose
creator died is failed by a sweep) and `final:<batch id>` (the finalizer's lock).

A line's answer is kept once (`answer`: HSETNX, and the batch's count moved only by the write that kept it, in one
script), so a line answered twice (a worker that died after answering, its line reclaimed) counts once.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from gateway.batches.objects import Batch, BatchFile

__all__ = ["BatchStore"]

# KEYS: answers hash, batch hash. ARGV: line index, output line, "completed" | "failed", input and output tokens.
# Returns {kept (0|1), answered so far, total}. A batch no longer running keeps no answer (its finalizer has read them).
_ANSWER_LUA = """
local status = redis.call('HGET', KEYS[2], 'status')
if status ~= 'in_progress' and status ~= 'cancelling' then return {0, 0, 1} end
local kept = redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])
if kept == 1 then
  redis.call('HINCRBY', KEYS[2], ARGV[3], 1)
  redis.call('HINCRBY', KEYS[2], 'input_tokens', ARGV[4])
  redis.call('HINCRBY', KEYS[2], 'output_tokens', ARGV[5])
end
local counts = redis.call('HMGET', KEYS[2], 'completed', 'failed', 'total')
return {kept, tonumber(counts[1] or '0') + tonumber(counts[2] or '0'), tonumber(counts[3] or '0')}
"""

# KEYS: batch hash. ARGV: the time. Moves a batch validating or in progress to "cancelling"; returns its status before.
_CANCEL_LUA = """
local status = redis.call('HGET', KEYS[1], 'status')
if status == 'validating' or status == 'in_progress' then
  redis.call('HSET', KEYS[1], 'status', 'cancelling', 'cancelling_at', ARGV[1])
end
return status
"""

_COUNTED = ("completed", "failed", "input_tokens", "output_tokens")  # moved by the answer script only


class BatchStore:
    """Shares, does not own, the Redis client."""

    def __init__(self, redis: aioredis.Redis, prefix: str) -> None:
        self._redis: Any = redis  # redis-py's stubs type replies as bytes | str: these are bytes
        self._base = f"{prefix}{{batches}}:"
        self._answer = redis.register_script(_ANSWER_LUA)
        self._cancel = redis.register_script(_CANCEL_LUA)

    def key(self, *parts: str) -> str:
        return self._base + ":".join(parts)

    async def put_file(self, file: BatchFile) -> None:
        await self._redis.hset(self.key("file", file.id), mapping=file.to_fields())

    async def file(self, file_id: str) -> BatchFile | None:
        raw = await self._redis.hgetall(self.key("file", file_id))
        return BatchFile.from_fields(raw) if raw else None

    async def delete_file(self, file_id: str) -> None:
        await self._redis.delete(self.key("file", file_id))

    async def put_batch(self, batch: Batch, *, index: bool = False) -> None:
        """Write the whole object (`index`: also add it to its tenant's list, as a new batch)."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(self.key("batch", batch.id), mapping=batch.to_fields())
            if index:
                pipe.zadd(self.key("batches", batch.tenant), {batch.id: batch.created_at})
            await pipe.execute()

    async def set_status(self, batch: Batch) -> None:
        """Write the batch's status, times and file ids, never its counts (the answer script moves those)."""
        fields = {k: v for k, v in batch.to_fields().items() if k not in _COUNTED}
        await self._redis.hset(self.key("batch", batch.id), mapping=fields)

    async def cancel(self, batch_id: str, at: int) -> str:
        """Move the batch to "cancelling" if it is validating or in progress, in one step (a finalizer that ends it
        meanwhile is never overwritten); its status before."""
        before = await self._cancel(keys=[self.key("batch", batch_id)], args=[at])
        return before.decode() if isinstance(before, bytes) else str(before or "")

    async def batch(self, batch_id: str) -> Batch | None:
        raw = await self._redis.hgetall(self.key("batch", batch_id))
        return Batch.from_fields(raw) if raw else None

    async def batch_ids(self, tenant: str) -> list[str]:
        """The tenant's batch ids, newest first."""
        ids = await self._redis.zrevrange(self.key("batches", tenant), 0, -1)
        return [i.decode() for i in ids]

    async def answer(self, batch_id: str, index: int, line: bytes, ok: bool,
                     tokens: tuple[int, int] = (0, 0)) -> tuple[bool, bool]:
        """Keep `line` as line `index`'s answer unless it has one or the batch is no longer running (in progress or
        cancelling): (kept, every line of the batch answered now). `tokens` (input, output) add to the batch's usage
        with the answer kept.
        `answers` gives it back behind one byte: b"1" for a line answered 2xx (`ok`), else b"0"."""
        result: list[Any] = await self._answer(keys=[self.key("answers", batch_id), self.key("batch", batch_id)],
                                               args=[index, (b"1" if ok else b"0") + line,
                                                     "completed" if ok else "failed", *tokens])
        kept, answered, total = (int(v) for v in result)
        return bool(kept), answered >= total

    async def answers(self, batch_id: str) -> dict[int, bytes]:
        raw = await self._redis.hgetall(self.key("answers", batch_id))
        return {int(k): v for k, v in raw.items()}

    async def validating(self, batch_id: str, since: int) -> None:
        await self._redis.zadd(self.key("validating"), {batch_id: since})

    async def validated(self, batch_id: str) -> None:
        await self._redis.zrem(self.key("validating"), batch_id)

    async def validating_since(self, before: float) -> list[str]:
        """Batches whose validation began before `before` (UTC epoch s) and never ended: their creator died."""
        return [i.decode() for i in await self._redis.zrangebyscore(self.key("validating"), "-inf", before)]

    async def open_ids(self) -> list[str]:
        return sorted(i.decode() for i in await self._redis.smembers(self.key("open")))

    async def opened(self, batch_id: str) -> None:
        await self._redis.sadd(self.key("open"), batch_id)

    async def closed(self, batch_id: str) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.srem(self.key("open"), batch_id)
            pipe.delete(self.key("answers", batch_id))
            await pipe.execute()

    async def lock_final(self, batch_id: str, holder: str, ttl_s: int = 60) -> bool:
        return bool(await self._redis.set(self.key("final", batch_id), holder, nx=True, ex=ttl_s))

    async def unlock_final(self, batch_id: str) -> None:
        await self._redis.delete(self.key("final", batch_id))
