"""The learning loop's writes to Redis: kept prompts, feedback, shadow verdicts, cascade labels.

Keys and field names are `router_models.training.ledger_labels`' (the training reader's), under the ledger's prefix.
Every write is one MULTI round trip that replaces the whole hash and sets its TTL, so a later write for the
same request id wins whole (no field of an older one lingers). Whether a tenant owns a request id is read from
the kept prompt or, for requests not kept, from the request's ledger record (`gateway.ledger.layouts`: the
ledger keeps a record under its tenant's key, or under the request id alone in the layout before).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import redis.asyncio as aioredis

from gateway.ledger.keys import LedgerKeys
from gateway.ledger.layouts import record_entry
from router_models.training.ledger_labels import LabelKeys

__all__ = ["LearningStore"]

_OWNER_RETRIES_S = (0.05, 0.2)  # a ledger record is written just after its answer: look again briefly


class LearningStore:
    """Reads and writes the learning hashes on a Redis client it shares (does not own or close)."""

    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        self._client = client
        self.labels = LabelKeys(prefix)
        self._ledger = LedgerKeys(prefix)

    async def put(self, key: str, fields: Mapping[str, str], ttl_s: int) -> None:
        """Replace the hash at `key` with `fields`, living `ttl_s` seconds. Raises `RedisError`."""
        async with self._client.pipeline(transaction=True) as pipe:
            pipe.delete(key)
            mapping: dict[Any, Any] = dict(fields)  # redis-py's key type is an invariant union
            pipe.hset(key, mapping=mapping)
            pipe.expire(key, ttl_s)
            await pipe.execute()

    async def owned_by(self, request_id: str, tenant: str) -> bool:
        """Whether `tenant` made `request_id`: a kept prompt or a ledger record of it names `tenant`. Retries
        briefly before False: the record of an answer just sent may still be on its way."""
        for delay in (0.0, *_OWNER_RETRIES_S):
            if delay:
                await asyncio.sleep(delay)
            owner = await self._owner_once(request_id, tenant)
            if owner is not None:
                return owner == tenant
        return False

    async def _owner_once(self, request_id: str, tenant: str) -> str | None:
        kept = await self._client.hget(self.labels.prompt(request_id), "tenant")
        if kept:
            return _text(kept)
        found = await record_entry(self._client, self._ledger, tenant, request_id)
        if found is None:
            return None
        stream, entry_id = found
        entries = await self._client.xrange(stream, min=entry_id, max=entry_id, count=1)
        for _, fields in entries or ():
            owner = (fields or {}).get(b"tenant")
            return _text(owner) if owner else None
        return None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
