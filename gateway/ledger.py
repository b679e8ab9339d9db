"""Cost ledger: one `CostRecord` per finished request, recorded exactly once, in Redis.

`RedisLedger` runs one Lua script per record that, atomically: skips a request id it has seen (idempotency
key `{prefix}req:{id}`, TTL = retention), XADDs the record to the stream `{prefix}records` (trimmed by
MINID to the retention), HINCRBYs the rollups per tenant x pool x model x UTC day and x UTC hour, and adds
the rollup to a per-day index so readers never SCAN. Money is integer micro-USD end to end: counters go
to HINCRBY as decimal strings and never pass through a float.

Loss window (details in docs/ledger.md): `record` returns only once Redis applied the record or the
outbox fsynced it. A record is lost only if (a) the process dies before `record` returns (the records in
flight: one Redis round trip or one fsync), (b) Redis loses acknowledged writes (its persistence: none
with `appendfsync always`, ~1 s with `everysec`, all with none), or (c) Redis is down and the outbox
write fails (then it is logged at ERROR as JSON). Replays never double-count within the retention.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import orjson
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from gateway.outbox import Outbox

__all__ = [
    "ROLLUP_FIELDS",
    "CostRecord",
    "InvalidCostRecord",
    "Ledger",
    "LedgerCounts",
    "LedgerKeys",
    "MemoryLedger",
    "RedisLedger",
    "record_from_fields",
    "record_to_fields",
    "rollup_slot",
    "validate_record",
]

_log = logging.getLogger(__name__)

MAX_TOKENS = 10**9  # per request
MAX_MICRO_USD = 10**12  # per request: one million USD
_EPOCH_MIN = 946_684_800.0  # 2000-01-01T00:00:00Z
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/@+\-]{0,127}")  # no ":" (key separator), no "{}" (hash tags)
_REQUEST_ID = re.compile(r"[\x21-\x7e]{1,128}")
_TEXT = re.compile(r"[^\x00-\x1f\x7f]{0,256}")
_STATUSES = frozenset({"ok", "client_disconnect", "upstream_error", "escalated"})
_USAGE_SOURCES = frozenset({"engine", "tokenizer", "estimate"})
_INT_FIELDS = ("prompt_tokens", "completion_tokens", "cost_micro_usd", "flagship_cost_micro_usd")
ROLLUP_FIELDS = ("requests", *_INT_FIELDS)  # the counters of every rollup hash
_STR_FIELDS = ("request_id", "tenant", "pool", "model", "rule", "policy_version", "status", "usage_source")


@dataclass(frozen=True, slots=True)
class CostRecord:
    """What one finished request used and cost. Money is integer micro-USD; times are UTC epoch seconds.

    `status` is "ok" (answer complete), "escalated" (a cascade probe replaced by the flagship),
    "client_disconnect" (charged for what was generated) or
    "upstream_error" (charged for what the engine reported before failing).
    """

    request_id: str
    tenant: str
    pool: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    cost_micro_usd: int
    flagship_cost_micro_usd: int  # what the same tokens would have cost on the flagship pool
    rule: str
    policy_version: str
    started_at: float
    ttft_ms: float | None
    latency_ms: float
    status: str = "ok"
    usage_source: str = "engine"  # "engine" (usage chunk), "tokenizer" (engine's /tokenize), "estimate"


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


class InvalidCostRecord(ValueError):
    """A record (from the gateway, the outbox or the stream) that the ledger refuses to count."""


def validate_record(rec: CostRecord, *, now: float | None = None) -> None:
    """Raise `InvalidCostRecord` naming the first bad field. `now` (UTC epoch s) bounds `started_at`."""
    for name in ("tenant", "pool", "model"):
        _check(name, getattr(rec, name), _NAME)
    _check("request_id", rec.request_id, _REQUEST_ID)
    _check("rule", rec.rule, _TEXT)
    _check("policy_version", rec.policy_version, _TEXT)
    for name in _INT_FIELDS:
        value = getattr(rec, name)
        limit = MAX_TOKENS if name.endswith("tokens") else MAX_MICRO_USD
        if type(value) is not int or not 0 <= value <= limit:
            raise InvalidCostRecord(f"{name}: must be an integer in [0, {limit}], got {value!r}")
    latest = (time.time() if now is None else now) + 86_400.0
    _check_float("started_at", rec.started_at, _EPOCH_MIN, latest)
    _check_float("latency_ms", rec.latency_ms, 0.0, math.inf)
    if rec.ttft_ms is not None:
        _check_float("ttft_ms", rec.ttft_ms, 0.0, math.inf)
    if rec.status not in _STATUSES:
        raise InvalidCostRecord(f"status: must be one of {sorted(_STATUSES)}, got {rec.status!r}")
    if rec.usage_source not in _USAGE_SOURCES:
        raise InvalidCostRecord(f"usage_source: must be one of {sorted(_USAGE_SOURCES)}")


def _check(name: str, value: object, pattern: re.Pattern[str]) -> None:
    if not isinstance(value, str) or pattern.fullmatch(value) is None:
        raise InvalidCostRecord(f"{name}: {value!r} does not match {pattern.pattern}")


def _check_float(name: str, value: object, low: float, high: float) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not low <= float(value) <= high:  # type: ignore[arg-type]
        raise InvalidCostRecord(f"{name}: must be a finite number in [{low}, {high}], got {value!r}")


def record_to_fields(rec: CostRecord) -> dict[str, str]:
    """Flat string form used in the stream entry and the outbox line (floats as `repr`, None as "")."""
    fields = {name: str(getattr(rec, name)) for name in _STR_FIELDS + _INT_FIELDS}
    fields["started_at"] = repr(float(rec.started_at))
    fields["ttft_ms"] = "" if rec.ttft_ms is None else repr(float(rec.ttft_ms))
    fields["latency_ms"] = repr(float(rec.latency_ms))
    return fields


def record_from_fields(fields: Mapping[str, str]) -> CostRecord:
    """Inverse of `record_to_fields`, validated. Raises `InvalidCostRecord` on any malformed field."""
    try:
        values: dict[str, Any] = {name: fields[name] for name in _STR_FIELDS}
        for name in _INT_FIELDS:
            if not (fields[name].isascii() and fields[name].isdigit()):
                raise ValueError(f"{name} is not a decimal integer")
            values[name] = int(fields[name])
        values["started_at"] = float(fields["started_at"])
        values["ttft_ms"] = float(fields["ttft_ms"]) if fields["ttft_ms"] else None
        values["latency_ms"] = float(fields["latency_ms"])
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise InvalidCostRecord(f"malformed record fields: {exc}") from exc
    rec = CostRecord(**values)
    validate_record(rec, now=math.inf)
    return rec


@dataclass(frozen=True, slots=True)
class LedgerKeys:
    """The Redis key schema, shared by the writer and the readers. Days are `YYYY-MM-DD` (UTC), hours
    `YYYY-MM-DDTHH`; index members are `tenant:pool:model` (day) and `HH:tenant:pool:model` (hour)."""

    prefix: str = "cascade:"

    @property
    def stream(self) -> str:
        return f"{self.prefix}records"

    def request(self, request_id: str) -> str:
        return f"{self.prefix}req:{request_id}"

    def day(self, day: str, member: str) -> str:
        return f"{self.prefix}rollup:day:{day}:{member}"

    def hour(self, day: str, hour_member: str) -> str:
        hour, member = hour_member.split(":", 1)
        return f"{self.prefix}rollup:hour:{day}T{hour}:{member}"

    def day_index(self, day: str) -> str:
        return f"{self.prefix}rollup:idx:{day}"

    def hour_index(self, day: str) -> str:
        return f"{self.prefix}rollup:hidx:{day}"


def rollup_slot(rec: CostRecord) -> tuple[str, str, str]:
    """(day, day index member, hour index member) of a record, from `started_at` in UTC."""
    when = datetime.fromtimestamp(rec.started_at, UTC)
    member = f"{rec.tenant}:{rec.pool}:{rec.model}"
    return when.strftime("%Y-%m-%d"), member, f"{when:%H}:{member}"


# KEYS: idempotency key, stream, day rollup, hour rollup, day index, hour index
# ARGV: ttl_s, retention_ms, prompt, completion, cost, flagship, day member, hour member, stream fields...
_RECORD_LUA = """#!lua
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local now = redis.call('TIME')
local minid = string.format('%.0f', tonumber(now[1]) * 1000 - tonumber(ARGV[2]))
local id = redis.call('XADD', KEYS[2], 'MINID', '~', minid, '*', unpack(ARGV, 9))
redis.call('SET', KEYS[1], id, 'EX', ARGV[1])
local fields = {'prompt_tokens', 'completion_tokens', 'cost_micro_usd', 'flagship_cost_micro_usd'}
for k = 3, 4 do
  redis.call('HINCRBY', KEYS[k], 'requests', 1)
  for i, field in ipairs(fields) do redis.call('HINCRBY', KEYS[k], field, ARGV[2 + i]) end
end
redis.call('SADD', KEYS[5], ARGV[7])
redis.call('SADD', KEYS[6], ARGV[8])
return 1
"""


@dataclass(slots=True)
class LedgerCounts:
    """What this process's ledger did since start (for metrics and tests); not persisted."""

    recorded: int = 0  # applied by Redis from `record`
    replayed: int = 0  # applied by Redis from the outbox
    duplicates: int = 0  # request ids Redis had already counted (retries, replays)
    spilled: int = 0  # written to the outbox
    lost: int = 0  # Redis down and outbox write failed: logged at ERROR with the full record


class RedisLedger:
    """`Ledger` on Redis, falling back to a local fsynced outbox while Redis is unreachable.

    Lifecycle: construct (no I/O), `await start()` (opens the outbox, replays one left by a previous
    process, starts the drain task), `record()` from any number of tasks, `await aclose()` (stops the
    drain task, waits for in-flight records, closes the connection pool; lines still in the outbox stay
    on disk for the next start). It owns its Redis client and its outbox directory (one process per
    directory). After one failure (socket timeouts `op_timeout_s`) `record` goes straight to the outbox
    until the drain task (every `drain_interval_s`) has replayed it, so an outage stalls no request for
    more than one timeout. `retention_days` bounds the stream and the idempotency keys; rollups stay.
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
        max_in_flight: int = 64,
        replay_batch: int = 256,
    ) -> None:
        if retention_days < 1 or max_in_flight < 1 or replay_batch < 1:
            raise ValueError("retention_days, max_in_flight and replay_batch must be >= 1")
        self.keys = LedgerKeys(key_prefix)
        self.counts = LedgerCounts()
        self._ttl_s = retention_days * 86_400
        self._client = aioredis.Redis.from_url(
            redis_url,
            socket_connect_timeout=op_timeout_s,
            socket_timeout=op_timeout_s,
            retry=Retry(NoBackoff(), 1),  # one immediate retry: a pooled socket may be stale after a restart
        )
        self._script = self._client.register_script(_RECORD_LUA)
        self._outbox = Outbox(outbox_dir)
        self._slots = asyncio.Semaphore(max_in_flight)
        self._drain_lock = asyncio.Lock()
        self._interval = drain_interval_s
        self._batch = replay_batch
        self._redis_up = True
        self._started = False
        self._drain_task: asyncio.Task[None] | None = None
        self._inflight: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Open the outbox, replay what a previous process left (if Redis is reachable), start draining."""
        await self._outbox.open()
        self._started = True
        if self._outbox.has_lines and not await self.drain():
            _log.warning("ledger outbox not replayed at start (Redis unreachable); retrying in background")
        self._drain_task = asyncio.create_task(self._drain_loop(), name="ledger-drain")

    async def record(self, rec: CostRecord) -> None:
        """Count `rec` once. Raises `InvalidCostRecord` for a malformed record; never for an outage.

        Returns after Redis applied it or the outbox fsynced it. Cancelling the caller does not cancel
        the write (it is shielded and awaited by `aclose`).
        """
        validate_record(rec)
        if not self._started:
            raise RuntimeError("RedisLedger.start() was not called")
        task = asyncio.create_task(self._record(rec))
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)
        await asyncio.shield(task)

    async def drain(self) -> bool:
        """Replay the outbox now. True when Redis answered and the outbox is empty; never raises."""
        async with self._drain_lock:
            try:
                await self._client.ping()
                await self._replay()
            except (RedisError, OSError) as exc:
                self._mark_down(exc)
                return False
        if not self._redis_up:
            _log.warning("ledger: Redis reachable again, outbox replayed")
        self._redis_up = True
        return True

    async def aclose(self) -> None:
        """Stop draining, finish in-flight records, release the outbox, close the pool. Idempotent."""
        if self._drain_task is not None:
            self._drain_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._drain_task
            self._drain_task = None
        await asyncio.gather(*self._inflight, return_exceptions=True)
        await self._outbox.aclose()
        await self._client.aclose()
        self._started = False

    async def _record(self, rec: CostRecord) -> None:
        if self._redis_up:
            try:
                async with self._slots:
                    applied = await self._apply(rec, self._client)
            except (RedisError, OSError) as exc:
                self._mark_down(exc)
            else:
                self._count(applied, replay=False)
                return
        await self._spill(rec)

    def _apply(self, rec: CostRecord, client: Any) -> Any:
        """Queue (pipeline) or run (client) the record script; the result is 1 if new, 0 if a duplicate."""
        day, member, hour_member = rollup_slot(rec)
        k = self.keys
        keys = [k.request(rec.request_id), k.stream, k.day(day, member), k.hour(day, hour_member)]
        keys += [k.day_index(day), k.hour_index(day)]
        counters = [rec.prompt_tokens, rec.completion_tokens, rec.cost_micro_usd, rec.flagship_cost_micro_usd]
        flat = [item for pair in record_to_fields(rec).items() for item in pair]
        args: list[str | int] = [self._ttl_s, self._ttl_s * 1000, *counters, member, hour_member, *flat]
        return self._script(keys=keys, args=args, client=client)

    async def _spill(self, rec: CostRecord) -> None:
        fields = record_to_fields(rec)
        try:
            await self._outbox.append(fields)
        except OSError as exc:
            self.counts.lost += 1
            _log.error("ledger record LOST (Redis down, outbox failed: %s): %s", exc, orjson.dumps(fields))
            return
        self.counts.spilled += 1

    async def _replay(self) -> None:
        while (good := await self._outbox.claim(record_from_fields)) is not None:
            for start in range(0, len(good), self._batch):
                async with self._client.pipeline(transaction=False) as pipe:
                    for rec in good[start : start + self._batch]:
                        await self._apply(rec, pipe)
                    for applied in await pipe.execute():
                        self._count(applied, replay=True)
            await self._outbox.release()

    async def _drain_loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                if not self._redis_up or self._outbox.has_lines:
                    await self.drain()
            except Exception:  # a bug here must not stop future drains
                _log.exception("ledger: outbox drain failed")

    def _count(self, applied: object, *, replay: bool) -> None:
        name = "duplicates" if applied != 1 else "replayed" if replay else "recorded"
        setattr(self.counts, name, getattr(self.counts, name) + 1)

    def _mark_down(self, exc: BaseException) -> None:
        if self._redis_up:
            _log.warning("ledger: Redis unreachable (%s); recording to the outbox", exc)
        self._redis_up = False
