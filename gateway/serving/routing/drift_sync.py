"""One judgement of tenants' drift for every gateway process on a Redis and key prefix
(`gateway.serving.routing.drift`).

Like the ladder's reports (`gateway.control.adaptation.ladder_sync`), without a leader: every `interval_s` each process
writes its per-tenant counts (figures below the in-domain bound, figures in its window) under its own field of one hash,
reads every field written in the last `stale_s`, and judges each tenant on their sum (`DomainDrift.adopt`). So a
drift hold (`learning.in_domain.hold`) starts and ends for a tenant in every process alike, whatever worker its
requests reach. A process that stopped drops out after `stale_s`. Redis unreachable: each process judges its own
window until it answers again (logged once each way).

Key: `<prefix>drift:{sync}:reports` (hash process id -> JSON {"at": UTC epoch s, "tenants": {tenant: [below,
total]}}), expiring `stale_s` after the latest write.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections.abc import Callable, Mapping

import orjson
import redis.asyncio as aioredis

from backends.background import stop
from gateway.serving.routing.drift import DomainDrift

__all__ = ["DriftSync", "merge_counts"]

log = logging.getLogger("cascade.router")


def merge_counts(reports: Mapping[str, bytes | str], now: float, stale_s: float) -> dict[str, tuple[int, int]]:
    """Per tenant, the sum of the fresh reports' (below, total); a report unreadable or older than `stale_s` is
    left out."""
    merged: dict[str, tuple[int, int]] = {}
    for text in reports.values():
        try:
            report = orjson.loads(text)
            if now - float(report["at"]) > stale_s:
                continue
            for tenant, (below, total) in report["tenants"].items():
                was = merged.get(tenant, (0, 0))
                merged[tenant] = (was[0] + int(below), was[1] + int(total))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            continue
    return merged


class DriftSync:
    """Shares `drift` (this process's) through `redis` (borrowed). `start` runs the loop (an owned task, ended by
    `aclose`); `tick` is one round, for tests. `clock` is UTC epoch seconds."""

    def __init__(self, redis: aioredis.Redis, prefix: str, drift: DomainDrift, interval_s: float = 1.0,
                 stale_s: float = 10.0, clock: Callable[[], float] = time.time) -> None:
        self._redis = redis
        self._key = f"{prefix}drift:{{sync}}:reports"
        self._drift = drift
        self._interval = interval_s
        self._stale_s = stale_s
        self._clock = clock
        self._id = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._task: asyncio.Task[None] | None = None
        self._down = False

    async def tick(self) -> None:
        now = self._clock()
        mine = orjson.dumps({"at": now, "tenants": self._drift.counts()})
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.hset(self._key, self._id, mine)
                pipe.pexpire(self._key, round(self._stale_s * 1000))
                pipe.hgetall(self._key)
                reports = (await pipe.execute())[-1]
        except (aioredis.RedisError, OSError) as exc:
            if not self._down:
                log.warning("drift not shared (Redis unreachable: %s): each process judges its own window", exc)
            self._down = True
            self._drift.adopt(None)
            return
        if self._down:
            log.info("drift shared again")
            self._down = False
        self._drift.adopt(merge_counts(reports, now, self._stale_s))

    async def _loop(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception:  # a bug here must not stop the loop; the process keeps its own judgement
                log.exception("drift sync failed")
                self._drift.adopt(None)
            await asyncio.sleep(self._interval)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="drift-sync")

    async def aclose(self) -> None:
        await stop(self._task)  # cancels again if redis-py swallowed the first cancellation
        self._task = None
        with contextlib.suppress(aioredis.RedisError, OSError):
            await self._redis.hdel(self._key, self._id)  # gone now, not `stale_s` later
