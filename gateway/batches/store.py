"""Batches and files in Redis: their objects, each tenant's index of them, the lines' answers and the batches open.

Keys (`{prefix}{batches}:...`: one hash tag, so that every script and multi-key call also runs on Redis Cluster):
`file:<id>` and `batch:<id>` (hashes: the objects' fields), `batches:<tenant>` (sorted set of the tenant's batch ids by
creation time), `answers:<batch id>` (hash: line index -> its output line), `open` (set of the batch ids workers
serve: in progress or cancelling), `validating` (sorted set of the batches being validated, by start time: one whose
creator died is failed by a sweep), `final:<batch id>` (the finalizer's lock), `files:expiring` (sorted set of the
file ids by the time the sweep next looks at them: their expiry, or later while a batch holds them), `holds:<file id>`
(sorted set of the batches reading the file, each until a time: +inf while the batch is open) and `files:unlink` (set
of the files whose object is deleted and whose bytes may still be on disk).

A file expires in one script (`expire`) that deletes its object only if no batch holds it: a batch takes its hold
(`hold`, refused once the object is gone) before it reads the file, so no sweep deletes a file a batch still reads.

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

# KEYS: file hash, its holds. ARGV: batch id, held until (UTC epoch s, or "+inf"). 1 if held, 0 if the file is gone.
_HOLD_LUA = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
return 1
"""

# KEYS: file hash, its holds, the expiring index, the unlink set. ARGV: file id, now, when to look again if held.
# Deletes the file's object and marks its bytes for unlinking, unless it has not expired or a batch holds it; 1 if
# deleted. A hold whose time has passed (its batch's creator died while validating) no longer holds.
_EXPIRE_LUA = """
local expires = tonumber(redis.call('HGET', KEYS[1], 'expires_at') or '0')
if expires > tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[3], expires, ARGV[1])
  return 0
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[2])
if redis.call('ZCARD', KEYS[2]) > 0 then
  redis.call('ZADD', KEYS[3], ARGV[3], ARGV[1])
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('SADD', KEYS[4], ARGV[1])
return 1
"""

_COUNTED = ("completed", "failed", "input_tokens", "output_tokens")  # moved by the answer script only


class BatchStore:
    """Shares, does not own, the Redis client."""

    def __init__(self, redis: aioredis.Redis, prefix: str) -> None:
        self._redis: Any = redis  # redis-py's stubs type replies as bytes | str: these are bytes
        self._base = f"{prefix}{{batches}}:"
        self._answer = redis.register_script(_ANSWER_LUA)
        self._cancel = redis.register_script(_CANCEL_LUA)
        self._hold = redis.register_script(_HOLD_LUA)
        self._expire = redis.register_script(_EXPIRE_LUA)

    def key(self, *parts: str) -> str:
        return self._base + ":".join(parts)

    async def put_file(self, file: BatchFile) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(self.key("file", file.id), mapping=file.to_fields())
            if file.expires_at:
                pipe.zadd(self.key("files", "expiring"), {file.id: file.expires_at})
            await pipe.execute()

    async def file(self, file_id: str) -> BatchFile | None:
        raw = await self._redis.hgetall(self.key("file", file_id))
        return BatchFile.from_fields(raw) if raw else None

    async def delete_file(self, file_id: str) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(self.key("file", file_id))
            pipe.zrem(self.key("files", "expiring"), file_id)
            await pipe.execute()

    async def hold(self, file_id: str, batch_id: str, until: float) -> bool:
        """Keep the file from expiring while `batch_id` reads it, until `until` (UTC epoch s; `opened` keeps it
        until `closed`); False, and no hold, when the file is gone."""
        held = await self._hold(keys=[self.key("file", file_id), self.key("holds", file_id)], args=[batch_id, until])
        return bool(held)

    async def release(self, file_id: str, batch_id: str) -> None:
        await self._redis.zrem(self.key("holds", file_id), batch_id)

    async def expiring(self, now: float, count: int) -> list[str]:
        """At most `count` files due a look from the expiry sweep at `now`, soonest first."""
        due = await self._redis.zrangebyscore(self.key("files", "expiring"), "-inf", now, start=0, num=count)
        return [i.decode() for i in due]

    async def expire(self, file_id: str, now: float, recheck_at: float) -> bool:
        """Delete the file's object if it expired by `now` and no batch holds it (its id then waits in `unlinked`
        for its bytes to be deleted); a held file is looked at again at `recheck_at`. Whether it was deleted."""
        deleted = await self._expire(keys=[self.key("file", file_id), self.key("holds", file_id),
                                           self.key("files", "expiring"), self.key("files", "unlink")],
                                     args=[file_id, now, recheck_at])
        return bool(deleted)

    async def unlinked(self, count: int) -> list[str]:
        """At most `count` files whose object is deleted and whose bytes may still be on disk."""
        return [i.decode() for i in await self._redis.srandmember(self.key("files", "unlink"), count)]

    async def unlink_done(self, file_id: str) -> None:
        await self._redis.srem(self.key("files", "unlink"), file_id)

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

    async def opened(self, batch_id: str, input_file_id: str) -> None:
        """The batch served by the workers, its hold on its input file kept until it is `closed`."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.sadd(self.key("open"), batch_id)
            pipe.zadd(self.key("holds", input_file_id), {batch_id: "+inf"})
            await pipe.execute()

    async def closed(self, batch_id: str, input_file_id: str = "") -> None:
        """The batch no longer served, its answers deleted and its hold on `input_file_id` released."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.srem(self.key("open"), batch_id)
            pipe.delete(self.key("answers", batch_id))
            if input_file_id:
                pipe.zrem(self.key("holds", input_file_id), batch_id)
            await pipe.execute()

    async def lock_final(self, batch_id: str, holder: str, ttl_s: int = 60) -> bool:
        return bool(await self._redis.set(self.key("final", batch_id), holder, nx=True, ex=ttl_s))

    async def unlock_final(self, batch_id: str) -> None:
        await self._redis.delete(self.key("final", batch_id))
