"""Reading the ledger in both of its key layouts: the tenant-tagged one the writer uses now
(`gateway.ledger.keys.LedgerKeys`) and the untagged one written before (`LegacyLedgerKeys`: one stream,
global per-day indexes, `spend:{tenant}:{month}`), which a single Redis upgraded in place still holds.

Upgrade by reading both, not by migrating: nothing is rewritten, so several gateway processes of either
version can run side by side during a rolling upgrade, and no step can half-move a record. A figure is the
sum over both layouts; a record is in exactly one of them (a replay of a record the old layout counted is
caught by `RedisLedger` through the old idempotency key). The old keys stop mattering by themselves: the
stream and the idempotency keys expire with the retention, spend a month later; only the rollups and
indexes, which are kept forever, stay read. Every command here is single-key, so it also runs on a cluster.

The callers own the client; these helpers only read, and raise `RedisError` like the client does.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gateway.ledger.keys import LedgerKeys

__all__ = ["LegacyLedgerKeys", "RollupKey", "read_spend", "record_entry", "rollup_keys", "rollup_name", "stream_keys",
           "stream_names"]


@dataclass(frozen=True, slots=True)
class LegacyLedgerKeys:
    """The key layout before the hash tags (single Redis only). Read, never written, by this version."""

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

    def spend(self, tenant: str, month: str) -> str:
        return f"{self.prefix}spend:{tenant}:{month}"


def rollup_name(kind: Literal["day", "hour"], day: str, member: str) -> str:
    """A rollup's name in both layouts, without the prefix (what `cascade costs verify` prints):
    `rollup:day:{day}:{tenant}:{pool}:{model}` or `rollup:hour:{day}T{HH}:{tenant}:{pool}:{model}`."""
    if kind == "day":
        return f"rollup:day:{day}:{member}"
    hour, rest = member.split(":", 1)
    return f"rollup:hour:{day}T{hour}:{rest}"


@dataclass(frozen=True, slots=True)
class RollupKey:
    """One rollup hash in one layout: its kind, UTC day, index member (`tenant:pool:model`, or
    `HH:tenant:pool:model` for an hour) and Redis key."""

    kind: Literal["day", "hour"]
    day: str
    member: str
    key: str

    @property
    def name(self) -> str:
        return rollup_name(self.kind, self.day, self.member)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def rollup_keys(client: Any, keys: LedgerKeys, days: Sequence[str],
                      kind: Literal["day", "hour"] = "day") -> list[RollupKey]:
    """Every day (or hour) rollup of `days`, in both layouts, sorted by day and member; a rollup written in
    both (a day of a rolling upgrade) comes twice, once per key. Two pipelined round trips in all."""
    legacy = LegacyLedgerKeys(keys.prefix)
    async with client.pipeline(transaction=False) as pipe:
        for day in days:
            pipe.smembers(keys.tenants_of_day(day))
            pipe.smembers(legacy.day_index(day) if kind == "day" else legacy.hour_index(day))
        first = await pipe.execute() if days else []
    tenants = [(day, _text(t)) for day, raw in zip(days, first[::2], strict=True) for t in sorted(raw)]
    async with client.pipeline(transaction=False) as pipe:
        for day, tenant in tenants:
            pipe.smembers(keys.day_index(tenant, day) if kind == "day" else keys.hour_index(tenant, day))
        second = await pipe.execute() if tenants else []
    found: list[RollupKey] = []
    new_key = keys.day if kind == "day" else keys.hour
    old_key = legacy.day if kind == "day" else legacy.hour
    for (day, _), members in zip(tenants, second, strict=True):
        found += [RollupKey(kind, day, m, new_key(day, m)) for m in map(_text, members)]
    for day, members in zip(days, first[1::2], strict=True):
        found += [RollupKey(kind, day, m, old_key(day, m)) for m in map(_text, members)]
    return sorted(found, key=lambda r: (r.day, r.member, r.key))


def stream_names(keys: LedgerKeys, tenants: Iterable[bytes | str]) -> list[str]:
    """The record streams of `tenants` (the members of `keys.tenants`), after the old layout's single
    stream (which may be gone: reading a missing stream gives nothing)."""
    return [LegacyLedgerKeys(keys.prefix).stream, *(keys.stream(t) for t in sorted(map(_text, tenants)))]


async def stream_keys(client: Any, keys: LedgerKeys) -> list[str]:
    """`stream_names` of every registered tenant: one SMEMBERS."""
    return stream_names(keys, await client.smembers(keys.tenants))


async def record_entry(client: Any, keys: LedgerKeys, tenant: str, request_id: str) -> tuple[str, str] | None:
    """(stream key, entry id) of the record of `request_id` made for `tenant`, in either layout; None when
    neither holds it (never recorded, or older than the retention)."""
    legacy = LegacyLedgerKeys(keys.prefix)
    for stream, key in ((keys.stream(tenant), keys.request(tenant, request_id)),
                        (legacy.stream, legacy.request(request_id))):
        entry_id = await client.get(key)
        if entry_id:
            return stream, _text(entry_id)
    return None


async def read_spend(client: Any, keys: LedgerKeys, tenant: str, month: str, fields: Iterable[str]) -> list[int]:
    """`fields` of `tenant`'s spend hash for UTC month `month` (micro-USD), summed over both layouts; a
    missing field is 0. One pipelined round trip (two single-key HMGETs)."""
    names = list(fields)
    async with client.pipeline(transaction=False) as pipe:
        pipe.hmget(keys.spend(tenant, month), names)
        pipe.hmget(LegacyLedgerKeys(keys.prefix).spend(tenant, month), names)
        new, old = await pipe.execute()
    return [int(a or 0) + int(b or 0) for a, b in zip(new, old, strict=True)]

