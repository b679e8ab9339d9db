"""Finance reports read from the ledger's rollups, and reconciliation of the rollups with the stream.

`load_report` reads the day rollups of a UTC date range through the per-day index (no SCAN);
`CostReport.rows(by)` groups them by tenant, pool, model, day or endpoint (chat, Responses, completions: that view
splits requests, tokens, cost and savings, which the rollups count per endpoint). Every figure is an integer (micro-USD,
tokens, requests) until it is formatted: USD with 6 decimals, percentages with one. `verify` recomputes
the day and hour rollups from the per-request stream and lists every difference.

The caller owns (and closes) the Redis client passed in; nothing here opens a connection.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from gateway.costs.counters import Counters, display, pct, usd
from gateway.costs.prefixes import PrefixScan
from gateway.costs.prices import PriceBasis, price_basis
from gateway.ledger.layouts import RollupKey, rollup_keys, rollup_name, stream_keys
from gateway.ledger.record import SPLIT_ENDPOINTS
from gateway.ledger.store import (
    ROLLUP_FIELDS,
    CostRecord,
    InvalidCostRecord,
    LedgerKeys,
    record_from_fields,
    rollup_slot,
)

if TYPE_CHECKING:
    from gateway.costs.estimate import QualityEstimate
    from policies.schema import Policy

__all__ = [
    "GROUPINGS",
    "Cell",
    "CostReport",
    "Counters",
    "Difference",
    "Reconciliation",
    "ReportRow",
    "days_between",
    "display",
    "load_report",
    "pct",
    "row_fields",
    "stream_records",
    "usd",
    "verify",
]

GROUPINGS = ("tenant", "pool", "model", "day", "endpoint")
ENDPOINTS = ("chat", *SPLIT_ENDPOINTS)


@dataclass(frozen=True, slots=True)
class Cell:
    """One day rollup: tenant x pool x model x UTC day (`YYYY-MM-DD`)."""

    day: str
    tenant: str
    pool: str
    model: str
    counters: Counters


@dataclass(frozen=True, slots=True)
class ReportRow:
    """One group of a report; `pool_requests` counts its requests per pool (the routing share)."""

    key: str
    counters: Counters
    pool_requests: Mapping[str, int] = field(default_factory=dict)


def days_between(start: date, end: date) -> list[str]:
    """Every UTC day from `start` to `end` inclusive, as `YYYY-MM-DD`."""
    return [(start + timedelta(days=i)).isoformat() for i in range((end - start).days + 1)]


@dataclass(frozen=True, slots=True)
class CostReport:
    """The day rollups of `start..end` (inclusive, UTC) under a ledger prefix, the quality routing kept
    (`gateway.costs.quality`, shown beside the savings when set) and the rates the costs were derived from
    (`gateway.costs.prices`)."""

    start: date
    end: date
    cells: tuple[Cell, ...]
    quality: QualityEstimate | None = None
    prices: PriceBasis | None = None
    prefix: str | None = None  # the ledger key prefix the cells were read under (`load_report`)
    source: str | None = None  # where that ledger is, for people (a Redis URL without credentials)
    flagship_pool: str | None = None  # the policy's flagship (`with_prices`)
    elsewhere: PrefixScan | None = None  # an empty report's hint: the prefixes with records on its Redis

    def with_prices(self, policy: Policy, source: str) -> CostReport:
        """This report stating the rates of its pools and the flagship in `policy` (read from `source`)."""
        flagship = policy.routing.flagship_pool
        return replace(self, prices=price_basis(self.pools, policy, source), flagship_pool=flagship)

    @property
    def pools(self) -> list[str]:
        return sorted({c.pool for c in self.cells})

    @property
    def days(self) -> list[str]:
        return days_between(self.start, self.end)

    def rows(self, by: str) -> list[ReportRow]:
        """Groups by `by` (one of GROUPINGS): days in order, others by cost, highest first."""
        if by not in GROUPINGS:
            raise ValueError(f"by must be one of {GROUPINGS}, got {by!r}")
        if by == "endpoint":
            return self._by_endpoint()
        groups: dict[str, list[Cell]] = defaultdict(list)
        for cell in self.cells:
            groups[getattr(cell, by)].append(cell)
        rows = [_row(key, cells) for key, cells in groups.items()]
        if by == "day":
            return sorted(rows, key=lambda r: r.key)
        return sorted(rows, key=lambda r: (-r.counters.cost_micro_usd, r.key))

    def total(self) -> ReportRow:
        return _row("TOTAL", self.cells)

    def _by_endpoint(self) -> list[ReportRow]:
        """One row per endpoint that has requests: its requests, tokens, cost and savings (`Counters.of_endpoint`),
        and its requests per pool."""
        rows = []
        for endpoint in ENDPOINTS:
            per_pool: dict[str, int] = defaultdict(int)
            total = Counters()
            for cell in self.cells:
                part = cell.counters.of_endpoint(endpoint)
                per_pool[cell.pool] += part.requests
                total += part
            if total.requests:
                rows.append(ReportRow(endpoint, total, dict(per_pool)))
        return sorted(rows, key=lambda r: (-r.counters.cost_micro_usd, r.key))

    def cost_by_day_and_pool(self) -> dict[str, dict[str, int]]:
        """micro-USD spent per day (every day of the range) and pool."""
        out: dict[str, dict[str, int]] = {d: dict.fromkeys(self.pools, 0) for d in self.days}
        for cell in self.cells:
            out[cell.day][cell.pool] += cell.counters.cost_micro_usd
        return out


def _row(key: str, cells: Iterable[Cell]) -> ReportRow:
    total = Counters()
    per_pool: dict[str, int] = defaultdict(int)
    for cell in cells:
        total += cell.counters
        per_pool[cell.pool] += cell.counters.requests
    return ReportRow(key, total, dict(per_pool))


async def load_report(client: Redis, keys: LedgerKeys, start: date, end: date) -> CostReport:
    """Read the day rollups of `start..end` through the per-day registries and indexes, in both key layouts
    (`gateway.ledger.layouts`): 3 pipelined round trips in all. A rollup kept in both layouts (written on
    the day of the upgrade) is one cell, the sum of the two."""
    merged: dict[tuple[str, str], Counters] = {}
    for found, counters in await _read_hashes(client, await rollup_keys(client, keys, days_between(start, end))):
        merged[(found.day, found.member)] = merged.get((found.day, found.member), Counters()) + counters
    cells = [Cell(day, *_triple(member), counters) for (day, member), counters in merged.items()]
    return CostReport(start, end, tuple(cells), prefix=keys.prefix)


def _triple(member: str) -> tuple[str, str, str]:
    tenant, pool, model = member.split(":")
    return tenant, pool, model


async def _read_hashes(client: Redis, found: list[RollupKey]) -> list[tuple[RollupKey, Counters]]:
    """Each rollup's counters, one pipelined round trip (one per master on a cluster)."""
    if not found:
        return []
    async with client.pipeline(transaction=False) as pipe:
        for one in found:
            pipe.hgetall(one.key)
        hashes = await pipe.execute()
    return [(one, Counters.from_hash(raw)) for one, raw in zip(found, hashes, strict=True)]


def row_fields(row: ReportRow, pools: list[str]) -> dict[str, Any]:
    """Machine-readable row: integers for money (micro-USD) plus USD strings; shares per pool."""
    c = row.counters
    per_1k = c.cost_per_1k_tokens_micro_usd
    out: dict[str, Any] = {
        "key": row.key,
        **{f.name: getattr(c, f.name) for f in fields(c)},
        "total_tokens": c.total_tokens,
        "cost_usd": usd(c.cost_micro_usd),
        "cost_per_1k_tokens_micro_usd": per_1k,
        "cost_per_1k_tokens_usd": None if per_1k is None else usd(per_1k),
        "flagship_cost_usd": usd(c.flagship_cost_micro_usd),
        "savings_micro_usd": c.savings_micro_usd,
        "savings_usd": usd(c.savings_micro_usd),
        "savings_pct": pct(c.savings_micro_usd, c.flagship_cost_micro_usd),
        "cache_hit_rate": pct(c.cache_hits, c.cache_lookups),
        "cache_avoided_usd": usd(c.cache_avoided_micro_usd),
        "output_check_failure_rate": pct(c.output_check_failed, c.output_checked),
        "quality_kept": pct(c.tier_quality_milli, c.top_quality_milli),
    }
    for pool in pools:
        out[f"share_{pool}"] = pct(row.pool_requests.get(pool, 0), c.requests)
    return out


@dataclass(frozen=True, slots=True)
class Difference:
    """A rollup field that does not match the sum of the stream records (missing hash = zeros)."""

    key: str
    field: str
    rollup: int
    recomputed: int


@dataclass(frozen=True, slots=True)
class Reconciliation:
    """Outcome of `verify`. `trimmed_through` is the oldest stream id kept after retention removed older
    entries, when it is later than the range's start (rollups of those days cannot be fully recomputed
    and will show differences)."""

    records: int
    rollups_checked: int
    differences: tuple[Difference, ...]
    duplicate_request_ids: tuple[str, ...]
    malformed_entries: tuple[str, ...]
    trimmed_through: str | None

    @property
    def ok(self) -> bool:
        return not (self.differences or self.duplicate_request_ids or self.malformed_entries)


async def verify(client: Redis, keys: LedgerKeys, start: date, end: date) -> Reconciliation:
    """Recompute the day and hour rollups of `start..end` from the streams and compare them, by rollup name
    (`gateway.ledger.layouts.rollup_name`: the sum over both key layouts on both sides)."""
    scan = await _recompute(client, keys, start, end)
    stored = await _read_rollups(client, keys, days_between(start, end))
    differences = [
        Difference(key, name, getattr(stored.get(key, Counters()), name), getattr(want, name))
        for key, want in sorted({**dict.fromkeys(stored, Counters()), **scan.expected}.items())
        for name in ROLLUP_FIELDS
        if getattr(stored.get(key, Counters()), name) != getattr(want, name)
    ]
    return Reconciliation(
        records=scan.records,
        rollups_checked=len(set(stored) | set(scan.expected)),
        differences=tuple(differences),
        duplicate_request_ids=tuple(sorted(scan.duplicates)),
        malformed_entries=tuple(scan.malformed),
        trimmed_through=await _trimmed_through(client, keys, start),
    )


@dataclass(slots=True)
class _Scan:
    expected: dict[str, Counters] = field(default_factory=dict)
    records: int = 0
    seen: set[str] = field(default_factory=set)
    duplicates: set[str] = field(default_factory=set)
    malformed: list[str] = field(default_factory=list)


async def _recompute(client: Redis, keys: LedgerKeys, start: date, end: date) -> _Scan:
    """Sum the stream records whose `started_at` falls in the range. Records are added at or after their
    start (late ones from the outbox), so the scan starts one day early (clock skew) and runs to the end."""
    scan, first, days = _Scan(), days_between(start, end)[0], set(days_between(start, end))
    start_ms = int(datetime.fromisoformat(first).replace(tzinfo=UTC).timestamp() * 1000) - 86_400_000
    async for entry_id, rec in stream_records(client, keys, start_ms):
        if rec is None:
            scan.malformed.append(entry_id)
        else:
            _add_entry(scan, days, rec)
    return scan


async def stream_records(client: Redis, keys: LedgerKeys,
                         start_ms: int) -> AsyncIterator[tuple[str, CostRecord | None]]:
    """(entry id, record) of every entry of the ledger's record streams (every tenant's, and the old layout's
    single one) from `start_ms` (epoch ms) on, stream by stream in pages of 1,000; the record is None for an
    entry that does not decode (malformed). Raises `RedisError`."""
    for stream in await stream_keys(client, keys):
        cursor = str(start_ms)
        while entries := await client.xrange(stream, min=cursor, max="+", count=1000):
            for entry_id, raw in entries:
                try:
                    rec = record_from_fields({_text(k): _text(v) for k, v in (raw or {}).items()})
                except (InvalidCostRecord, UnicodeDecodeError):
                    rec = None
                yield _text(entry_id), rec
            cursor = "(" + _text(entries[-1][0])


def _add_entry(scan: _Scan, days: set[str], rec: CostRecord) -> None:
    day, member, hour_member = rollup_slot(rec)
    if day not in days:
        return
    (scan.duplicates if rec.request_id in scan.seen else scan.seen).add(rec.request_id)
    scan.records += 1
    one = Counters.of(rec)
    for name in (rollup_name("day", day, member), rollup_name("hour", day, hour_member)):
        scan.expected[name] = scan.expected.get(name, Counters()) + one


async def _read_rollups(client: Redis, keys: LedgerKeys, days: list[str]) -> dict[str, Counters]:
    """Day and hour rollups of `days` by name (`rollup_name`), each the sum over both layouts."""
    found = [*await rollup_keys(client, keys, days, "day"), *await rollup_keys(client, keys, days, "hour")]
    out: dict[str, Counters] = {}
    for one, counters in await _read_hashes(client, found):
        out[one.name] = out.get(one.name, Counters()) + counters
    return out


async def _trimmed_through(client: Redis, keys: LedgerKeys, start: date) -> str | None:
    """The latest of the streams' oldest kept ids, among the streams from which older entries were removed
    and whose oldest kept id is later than the range's start (records of the range added before it are
    gone); None when no stream is. Redis trims by MINID without updating `max-deleted-entry-id` (only XDEL
    does), so removal is told by `entries-added` > `length`."""
    start_ms = int(datetime.combine(start, datetime.min.time(), UTC).timestamp() * 1000)
    latest: str | None = None
    for stream in await stream_keys(client, keys):
        try:
            info = await client.xinfo_stream(stream)
        except ResponseError:  # no such stream
            continue
        if int(info.get("entries-added") or 0) <= int(info.get("length") or 0):
            continue  # nothing removed (or Redis < 7: no `entries-added`)
        first = info.get("first-entry")
        oldest = _text(first[0] if first else info.get("last-generated-id"))
        if _id_ms(oldest) > start_ms and (latest is None or _id_ms(oldest) > _id_ms(latest)):
            latest = oldest
    return latest


def _id_ms(entry_id: str) -> int:
    return int(entry_id.split("-")[0])


def _text(value: bytes | str | None) -> str:
    """A Redis reply item as str (the client may or may not decode responses)."""
    if value is None:
        raise ValueError("unexpected nil in a Redis reply")
    return value.decode() if isinstance(value, bytes) else value
