"""Cost ledger: one `CostRecord` per finished request, recorded exactly once, in Redis.

`RedisLedger` runs one Lua script per record that, atomically and in the tenant's slot (every key carries the
hash tag `{<tenant>}`, so it also runs on Redis Cluster): skips a request id it has seen (idempotency key
`{prefix}ledger:{<tenant>}:req:{id}`, TTL = retention), XADDs the record to the tenant's stream (trimmed by
MINID to the retention), HINCRBYs the rollups per tenant x pool x model x UTC day and x UTC hour, adds
the rollup to a per-day index so readers never SCAN, and HINCRBYs the tenant's spend for the UTC day and
month (read by `gateway.tenancy.budgets`), releasing the request's budget hold (`gateway.ledger.holds`). The
record type and codec live in `gateway.ledger.record`, the key schema and the script in `gateway.ledger.keys`,
reading the layout before it in `gateway.ledger.layouts`; this module re-exports the first two. Money is integer
micro-USD end to end: counters go to HINCRBY as decimal strings and never pass through a float. The URL may
name a cluster (`gateway.redis_client`).

Loss window (details in docs/ledger.md): `record` returns only once Redis applied the record or the
outbox fsynced it. A record is lost only if (a) the process dies before `record` returns (the records in
flight: one Redis round trip or one fsync), (b) Redis loses acknowledged writes (its persistence: none
with `appendfsync always`, ~1 s with `everysec`, all with none), or (c) Redis is down and the outbox
write fails (then it is logged at ERROR as JSON). Replays never double-count within the retention.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import orjson
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError

from backends.background import cancel_requested, stop
from gateway.ledger.keys import RECORD_LUA, SPEND_TTL_EXTRA_S, LedgerKeys, rollup_slot
from gateway.ledger.layouts import LegacyLedgerKeys
from gateway.ledger.outbox import Outbox
from gateway.ledger.record import (
    EXTRA_COUNTERS,
    MAX_ROUTE,
    ROLLUP_FIELDS,
    CostRecord,
    InvalidCostRecord,
    extra_counters,
    overflow_scored,
    record_from_fields,
    record_to_fields,
    validate_record,
)
from gateway.redis_client import REDIS_FAILURES, close_quietly, redis_from_url

__all__ = [
    "EXTRA_COUNTERS",
    "MAX_ROUTE",
    "ROLLUP_FIELDS",
    "CostRecord",
    "InvalidCostRecord",
    "Ledger",
    "LedgerCounts",
    "LedgerKeys",
    "MemoryLedger",
    "RedisLedger",
    "extra_counters",
    "overflow_scored",
    "record_from_fields",
    "record_to_fields",
    "rollup_slot",
    "validate_record",
]

_log = logging.getLogger(__name__)


class Ledger(Protocol):
    """Records cost. `record` never raises for a storage outage: it must keep the record durably
    (outbox) and return. Calling `record` twice with the same request id counts it once."""

    async def record(self, rec: CostRecord) -> None: ...

    async def aclose(self) -> None: ...


class MemoryLedger:
    """In-process fake for unit tests: validating and idempotent per request id, like the real one."""

    def __init__(self) -> None:
        self.records: dict[str, CostRecord] = {}

    async def record(self, rec: CostRecord) -> None:
        validate_record(rec)
        self.records.setdefault(rec.request_id, rec)

    async def aclose(self) -> None:
        return None


@dataclass(slots=True)
class LedgerCounts:
    """What this process's ledger did since start (for metrics and tests); not persisted."""

    recorded: int = 0  # applied by Redis from `record`
    replayed: int = 0  # applied by Redis from the outbox
    duplicates: int = 0  # request ids Redis had already counted (retries, replays)
    spilled: int = 0  # written to the outbox
    lost: int = 0  # Redis down and outbox write failed: logged at ERROR with the full record
    on_event: Callable[[str], None] | None = None  # told each count's name as it rises (the metrics' counter)

    def add(self, name: str) -> None:
        """One more of `name` ("recorded", "replayed", "duplicates", "spilled" or "lost")."""
        setattr(self, name, getattr(self, name) + 1)
        if self.on_event is not None:
            self.on_event(name)


class RedisLedger:
    """`Ledger` on Redis, falling back to a local fsynced outbox while Redis is unreachable.

    Lifecycle: construct (no I/O), `await start()` (opens the outbox, replays one left by a previous
    process, starts the drain task), `record()` from any number of tasks, `await aclose()` (stops the
    drain task, waits for in-flight records, closes the connection pool; lines still in the outbox stay
    on disk for the next start). It owns its Redis client and its outbox directory (one process per
    directory). After one failure (socket timeouts `op_timeout_s`) `record` goes straight to the outbox
    until the drain task (every `drain_interval_s`) has replayed it, so an outage stalls no request for
    more than one timeout. `retention_days` bounds the stream and the idempotency keys; rollups stay.
    Records are group-committed: those that arrive while a batch is in flight go in the next pipeline
    (one round trip per batch, one atomic script per record), so Redis costs little CPU per request;
    a batch can wait `linger_s` (default 0: measured no gain on 2 cores) before it goes, which is also how
    much longer a record would stay only in memory.
    """

    def __init__(
        self,
        redis_url: str,
        outbox_dir: Path,
        key_prefix: str = "cascade:",
        retention_days: int = 35,
        *,
        op_timeout_s: float = 0.5,
        drain_interval_s: float = 1.0,
        replay_batch: int = 256,
        linger_s: float = 0.0,
    ) -> None:
        if retention_days < 1 or replay_batch < 1:
            raise ValueError("retention_days and replay_batch must be >= 1")
        self.keys = LedgerKeys(key_prefix)
        self.counts = LedgerCounts()
        self._ttl_s = retention_days * 86_400
        self._legacy = LegacyLedgerKeys(key_prefix)
        self._registered: set[tuple[str, str]] = set()  # (day, tenant) this process put in the registries
        self._client = redis_from_url(
            redis_url,
            socket_connect_timeout=op_timeout_s,
            socket_timeout=op_timeout_s,
            retry=Retry(NoBackoff(), 1),  # one immediate retry: a pooled socket may be stale after a restart
        )
        self._script = self._client.register_script(RECORD_LUA)
        self._outbox = Outbox(outbox_dir)
        self._drain_lock = asyncio.Lock()
        self._interval = drain_interval_s
        self._batch = replay_batch
        self._redis_up = True
        self._started = False
        self._drain_task: asyncio.Task[None] | None = None
        self._inflight: set[asyncio.Task[None]] = set()
        self._queue: list[tuple[CostRecord, asyncio.Future[None]]] = []
        self._linger = linger_s
        self._flusher: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Open the outbox, replay what a previous process left (if Redis is reachable), start draining."""
        await self._outbox.open()
        self._started = True
        if self._outbox.has_lines and not await self.drain():
            _log.warning("ledger outbox not replayed at start (Redis unreachable); retrying in background")
        self._drain_task = asyncio.create_task(self._drain_loop(), name="ledger-drain")

    def outbox_records(self) -> int:
        """Records waiting in the outbox on disk for Redis (`cascade_ledger_outbox_records`)."""
        return self._outbox.waiting

    async def record(self, rec: CostRecord) -> None:
        """Count `rec` once. Raises `InvalidCostRecord` for a malformed record; never for an outage.

        Returns after Redis applied it or the outbox fsynced it. Cancelling the caller does not cancel
        the write (it is shielded and awaited by `aclose`).
        """
        validate_record(rec)
        if not self._started:
            raise RuntimeError("RedisLedger.start() was not called")
        if not self._redis_up:
            task = asyncio.create_task(self._spill(rec))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)
            return await asyncio.shield(task)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append((rec, done))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush(), name="ledger-flush")
        await asyncio.shield(done)

    async def drain(self) -> bool:
        """Replay the outbox now. True when Redis answered and the outbox is empty; never raises."""
        async with self._drain_lock:
            try:
                await self._client.ping()
                await self._replay()
            except REDIS_FAILURES as exc:
                self._mark_down(exc)
                return False
        if not self._redis_up:
            _log.warning("ledger: Redis reachable again, outbox replayed")
        self._redis_up = True
        return True

    async def aclose(self) -> None:
        """Stop draining, finish in-flight records, release the outbox, close the pool. Idempotent."""
        await stop(self._drain_task)  # not a bare cancel: redis-py may swallow one mid-command
        self._drain_task = None
        if self._flusher is not None:
            await asyncio.gather(self._flusher, return_exceptions=True)
        await asyncio.gather(*self._inflight, return_exceptions=True)
        await self._outbox.aclose()
        await close_quietly(self._client, "the ledger")
        self._started = False

    async def _flush(self) -> None:
        """Group commit: every record queued while the previous batch was in flight goes to Redis in one
        pipeline (one round trip), still one atomic script per record. A failed batch goes to the outbox.
        Owns the queued futures: each is resolved only once its record is applied or spilled. It waits
        `linger_s` first, so that at low concurrency a few records still share one round trip."""
        if self._linger > 0:
            await asyncio.sleep(self._linger)
        while self._queue:
            batch, self._queue = self._queue[: self._batch], self._queue[self._batch :]
            try:
                if not self._redis_up:
                    raise ConnectionError("Redis marked down")
                results = await self._apply_all([rec for rec, _ in batch])
            except Exception as exc:  # Redis down, or anything else: the outbox keeps every record
                self._mark_down(exc)
                for rec, _ in batch:
                    await self._spill(rec)
            else:
                for applied in results:
                    self._count(applied, replay=False)
            for _, done in batch:
                if not done.done():
                    done.set_result(None)

    async def _apply_all(self, recs: list[CostRecord], *, replay: bool = False) -> list[Any]:
        """Apply `recs`; each result is 1 if the record is new, 0 if a duplicate. First (one round trip, only
        when there is something to do) puts new (day, tenant) pairs in the registries, so a counted record is
        always found by the readers, and for a replay asks the old layout's idempotency keys: a record an
        earlier version counted and left in its outbox is a duplicate, not counted again."""
        seen = await self._prepare(recs, replay=replay)
        results = iter(await self._run_scripts([rec for rec, old in zip(recs, seen, strict=True) if not old]))
        return [0 if old else next(results) for old in seen]

    async def _prepare(self, recs: list[CostRecord], *, replay: bool) -> list[bool]:
        """Register new (day, tenant) pairs; for a replay, whether each record is in the old layout."""
        pairs = {(rollup_slot(rec)[0], rec.tenant) for rec in recs} - self._registered
        if not pairs and not replay:
            return [False] * len(recs)
        async with self._client.pipeline(transaction=False) as pipe:
            for day, tenant in sorted(pairs):
                pipe.sadd(self.keys.tenants_of_day(day), tenant)
                pipe.sadd(self.keys.tenants, tenant)
            for rec in recs if replay else ():
                pipe.exists(self._legacy.request(rec.request_id))
            answers = await pipe.execute()
        if len(self._registered) > 100_000:  # bound the memory; registering again is harmless
            self._registered.clear()
        self._registered |= pairs
        return [bool(n) for n in answers[2 * len(pairs):]] if replay else [False] * len(recs)

    async def _run_scripts(self, recs: list[CostRecord]) -> list[Any]:
        """Run the record script for each of `recs` in one pipeline (one round trip; on a cluster, one per
        master, in parallel). Sends EVALSHA as a raw command: redis-py's Script in a pipeline would ask SCRIPT
        EXISTS first, a second round trip per batch, and its cluster pipeline refuses the `evalsha` method
        (not the command, which it routes by the first key). If Redis lost the script (a restart, SCRIPT
        FLUSH), load it (on every master) and run the batch once more: records a master had already applied
        come back as duplicates, so nothing counts twice."""
        if not recs:
            return []
        for attempt in (1, 2):
            async with self._client.pipeline(transaction=False) as pipe:
                for rec in recs:
                    keys, args = self._script_call(rec)
                    pipe.execute_command("EVALSHA", self._script.sha, len(keys), *keys, *args)
                try:
                    return list(await pipe.execute())
                except NoScriptError:
                    if attempt == 2:
                        raise
                    await self._client.script_load(RECORD_LUA)
        raise AssertionError("unreachable")

    def _script_call(self, rec: CostRecord) -> tuple[list[str], list[str | int]]:
        """The record script's keys and arguments for `rec`."""
        day, member, hour_member = rollup_slot(rec)
        k = self.keys
        keys = [k.request(rec.tenant, rec.request_id), k.stream(rec.tenant), k.day(day, member)]
        keys += [k.hour(day, hour_member), k.day_index(rec.tenant, day), k.hour_index(rec.tenant, day)]
        counters = [rec.prompt_tokens, rec.completion_tokens, rec.cost_micro_usd, rec.flagship_cost_micro_usd]
        flat = [item for pair in record_to_fields(rec).items() for item in pair]
        keys += [k.spend(rec.tenant, day[:7]), k.holds(rec.tenant), k.hold_expiry(rec.tenant),
                 k.key_spend(rec.tenant, day), k.key_holds(rec.tenant, rec.key_id),
                 k.key_hold_expiry(rec.tenant, rec.key_id)]
        args: list[str | int] = [self._ttl_s, self._ttl_s * 1000, *counters, member, hour_member]
        # only the counters this record moves: the script skips a 0 (HINCRBY by 0 would create the field), so
        # leaving them out adds nothing and saves packing and sending about 50 arguments per record
        extra = [(name, value) for name, value in zip(EXTRA_COUNTERS, extra_counters(rec), strict=True) if value]
        args += [self._ttl_s + SPEND_TTL_EXTRA_S, day, len(extra), *(item for pair in extra for item in pair),
                 rec.request_id, rec.key_id, *flat]
        return keys, args

    async def _spill(self, rec: CostRecord) -> None:
        fields = record_to_fields(rec)
        try:
            await self._outbox.append(fields)
        except OSError as exc:
            self.counts.add("lost")
            _log.error("ledger record LOST (Redis down, outbox failed: %s): %s", exc, orjson.dumps(fields))
            return
        self.counts.add("spilled")

    async def _replay(self) -> None:
        while (good := await self._outbox.claim(record_from_fields)) is not None:
            for start in range(0, len(good), self._batch):
                for applied in await self._apply_all(good[start : start + self._batch], replay=True):
                    self._count(applied, replay=True)
            await self._outbox.release()

    async def _drain_loop(self) -> None:
        while not cancel_requested():  # redis-py may turn our cancellation into an error we catch below
            await asyncio.sleep(self._interval)
            try:
                if not self._redis_up or self._outbox.has_lines:
                    await self.drain()
            except Exception:  # a bug here must not stop future drains
                _log.exception("ledger: outbox drain failed")

    def _count(self, applied: object, *, replay: bool) -> None:
        self.counts.add("duplicates" if applied != 1 else "replayed" if replay else "recorded")

    def _mark_down(self, exc: BaseException) -> None:
        if self._redis_up:
            _log.warning("ledger: Redis unreachable (%s); recording to the outbox", exc)
        self._redis_up = False
