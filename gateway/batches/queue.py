"""Batch lines shared among every gateway worker and host: one Redis stream per batch (`lines:<batch id>` under the
store's keys) and one consumer group (`workers`) over it.

`put` XADDs a batch's lines; `take` XREADGROUPs new lines of the open batches for one consumer; `reclaim`
XAUTOCLAIMs the lines another consumer took and has not acknowledged for `claim_after_s` (it died, or hangs); `done`
XACKs a line answered (or skipped); `requeue` puts a line back at the end of its stream and acknowledges the old
entry, in one transaction (a line the lane could not send yet). `pending` counts a batch's lines taken and not yet
acknowledged. At-least-once: a line may be taken twice (reclaimed); `BatchStore.answer` keeps its first answer.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from gateway.batches.input import BatchLine
from gateway.batches.store import BatchStore

__all__ = ["GROUP", "LineQueue", "Taken"]

GROUP = "workers"


@dataclass(frozen=True, slots=True)
class Taken:
    """A line taken from `batch_id`'s stream as entry `entry`."""

    batch_id: str
    entry: str
    line: BatchLine


class LineQueue:
    """Shares, does not own, the Redis client."""

    def __init__(self, redis: aioredis.Redis, store: BatchStore) -> None:
        self._redis: Any = redis  # redis-py's stubs type replies as bytes | str: these are bytes
        self._store = store

    def _stream(self, batch_id: str) -> str:
        return self._store.key("lines", batch_id)

    async def put(self, batch_id: str, lines: Iterable[BatchLine], chunk: int = 1000) -> None:
        """The lines on the batch's stream, its group made first (so no line is ever before the group)."""
        stream = self._stream(batch_id)
        try:
            await self._redis.xgroup_create(stream, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        batch = list(lines)
        for start in range(0, len(batch), chunk):
            async with self._redis.pipeline(transaction=False) as pipe:
                for line in batch[start:start + chunk]:
                    pipe.xadd(stream, {"line": line.to_bytes()})
                await pipe.execute()

    async def take(self, batch_ids: list[str], consumer: str, count: int) -> list[Taken]:
        """At most `count` new lines for `consumer`, from the batches in the order given (the caller rotates it, so
        that batches share the workers): one read per batch until `count` are taken (XREADGROUP's COUNT bounds
        each stream's share, not the sum). Never blocks."""
        taken: list[Taken] = []
        for batch_id in batch_ids:
            if len(taken) >= count:
                break
            try:
                replies = await self._redis.xreadgroup(GROUP, consumer, {self._stream(batch_id): ">"},
                                                       count=count - len(taken))
            except ResponseError as exc:  # the batch finished (its stream deleted) meanwhile
                if "NOGROUP" in str(exc):
                    continue
                raise
            taken += [_taken(self._store, stream, entry, fields) for stream, entries in replies or []
                      for entry, fields in entries]
        return taken

    async def reclaim(self, batch_id: str, consumer: str, claim_after_s: float, count: int) -> list[Taken]:
        stream = self._stream(batch_id)
        try:
            reply = await self._redis.xautoclaim(stream, GROUP, consumer, int(claim_after_s * 1000), "0-0",
                                                 count=count)
        except ResponseError as exc:
            if "NOGROUP" in str(exc):
                return []
            raise
        return [_taken(self._store, stream.encode(), entry, fields) for entry, fields in reply[1] if fields]

    async def done(self, taken: Taken) -> None:
        await self._redis.xack(self._stream(taken.batch_id), GROUP, taken.entry)

    async def requeue(self, taken: Taken) -> None:
        stream = self._stream(taken.batch_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.xadd(stream, {"line": taken.line.to_bytes()})
            pipe.xack(stream, GROUP, taken.entry)
            pipe.xdel(stream, taken.entry)
            await pipe.execute()

    async def pending(self, batch_id: str) -> int:
        try:
            summary = await self._redis.xpending(self._stream(batch_id), GROUP)
        except ResponseError as exc:
            if "NOGROUP" in str(exc):
                return 0
            raise
        return int(summary["pending"])

    async def drop(self, batch_id: str) -> None:
        await self._redis.delete(self._stream(batch_id))


def _taken(store: BatchStore, stream: bytes, entry: bytes, fields: dict[bytes, bytes]) -> Taken:
    batch_id = stream.decode().rsplit(":", 1)[-1]
    return Taken(batch_id, entry.decode(), BatchLine.from_bytes(fields[b"line"]))
