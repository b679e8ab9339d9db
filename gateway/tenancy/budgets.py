"""Per-tenant spend budgets (UTC day and month, integer micro-USD), read from the ledger's spend counters and held
against them while requests are in flight.

The ledger's record script HINCRBYs `{prefix}ledger:{<tenant>}:spend:{YYYY-MM}` (fields `month` and `YYYY-MM-DD`)
once per new request id, in the same atomic step as the rollups, so spend is exact and shared by every
gateway process, and retries or outbox replays never count twice. A record counts in the UTC day and
month of its `started_at`. Spend from the key layout before (`gateway.ledger.layouts`) is added, so spend from
before an upgrade counts (read at most once per `cache_s`: only a process of the version before writes it).

Contract for the caller, before routing each request: `verdict = await guard.reserve(tenant, budget, request_id,
worst_case)`. In one atomic step (`gateway.ledger.holds`) it tells where the tenant stands counting spend plus the
holds of its requests in flight and, unless that is "exceeded", holds `worst_case` micro-USD for the request
(`verdict.held`). `verdict.state == "exceeded"` → `raise verdict.error(tenant)` when `verdict.on_exceed ==
"reject"`, route to the micro pool when it is "downgrade"; `"soft"` → count a metric (the guard logs one warning
per tenant and period per process). The ledger releases the hold when it records the request's cost; a request
refused after admission is released with `release`. So concurrent requests see each other's holds: spend ends at
most one request's worst case above a limit, however many arrive at once.

Redis unreachable: the verdict is "ok" with `fail_open=True` (not checked, nothing held; `counts.fail_open`, a
warning at most once per `warn_interval_s`, Redis left alone for `retry_interval_s`). The spend itself is never
lost (the ledger's outbox keeps it) and is counted once Redis returns. Whether an unchecked request goes on is
the tenant's `on_redis_outage` policy, applied by `gateway.tenancy.admission`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, Protocol

from gateway.errors import BudgetExceeded
from gateway.ledger.holds import HOLD_LUA, RELEASE_LUA
from gateway.ledger.keys import SPEND_MONTH_FIELD, LedgerKeys, utc_periods
from gateway.ledger.layouts import LegacyLedgerKeys, read_spend
from gateway.tenancy.limits import FailOpen
from policies.schema import Budget

__all__ = ["BudgetChecker", "BudgetGuard", "BudgetGuardCounts", "BudgetVerdict", "KeyBudget", "KeyHold",
           "StaticBudgets", "evaluate", "key_budget_error"]

_log = logging.getLogger(__name__)

State = Literal["ok", "soft", "exceeded"]
Period = Literal["day", "month"]
_RANK: dict[State, int] = {"ok": 0, "soft": 1, "exceeded": 2}


@dataclass(frozen=True, slots=True)
class BudgetVerdict:
    """Where a tenant stands. Money in integer micro-USD; `resets_at` is the UTC end of `period`.

    `period`, `spent_micro_usd`, `limit_micro_usd`, `resets_at` and `retry_after_s` describe the period that
    decided `state` (the worse one; on a tie the month, which resets later); they are None/0 when "ok".
    `day_spent_micro_usd` / `month_spent_micro_usd` are the current totals (0 when unknown: fail open).
    `held_micro_usd` is what the tenant's other requests in flight held when this one was decided (counted in
    `spent_micro_usd` and `state`); `held` is True when this request's worst case is now held (`reserve`).
    """

    state: State
    on_exceed: Literal["reject", "downgrade"]
    period: Period | None = None
    spent_micro_usd: int = 0
    limit_micro_usd: int = 0
    resets_at: datetime | None = None
    retry_after_s: int = 0
    day_spent_micro_usd: int = 0
    month_spent_micro_usd: int = 0
    fail_open: bool = False
    held_micro_usd: int = 0
    held: bool = False

    @property
    def reject(self) -> bool:
        """True when the caller must refuse the request (`raise verdict.error(tenant)`)."""
        return self.state == "exceeded" and self.on_exceed == "reject"

    @property
    def downgrade(self) -> bool:
        """True when the caller must route the request to the micro pool instead."""
        return self.state == "exceeded" and self.on_exceed == "downgrade"

    def error(self, tenant: str) -> BudgetExceeded:
        """The 429 for an exceeded verdict: amounts in USD, the period, and when it resets (UTC)."""
        if self.period is None or self.resets_at is None:
            raise ValueError("error() needs an exceeded or soft verdict")
        name = "daily" if self.period == "day" else "monthly"
        spent = f"{_usd(self.spent_micro_usd - self.held_micro_usd)} USD"
        if self.held_micro_usd:
            spent += f" (and {_usd(self.held_micro_usd)} USD more held by requests in flight)"
        message = (
            f"Budget exceeded for tenant {tenant!r}: spent {spent} of its {name} "
            f"budget of {_usd(self.limit_micro_usd)} USD; it resets at {self.resets_at:%Y-%m-%dT%H:%M:%SZ} (UTC)."
        )
        return BudgetExceeded(message, self.retry_after_s)


def _usd(micro: int) -> str:
    sign = "-" if micro < 0 else ""
    return f"{sign}{abs(micro) // 1_000_000}.{abs(micro) % 1_000_000:06d}"


def _period_end(now: datetime, period: Period) -> datetime:
    if period == "day":
        return datetime(now.year, now.month, now.day, tzinfo=UTC) + timedelta(days=1)
    return datetime(now.year + now.month // 12, now.month % 12 + 1, 1, tzinfo=UTC)


def _state(spent: int, limit: int, soft_pct: int) -> State:
    if spent >= limit:
        return "exceeded"
    return "soft" if spent * 100 >= limit * soft_pct else "ok"


def evaluate(budget: Budget, day_spent: int, month_spent: int, now: float, held: int = 0) -> BudgetVerdict:
    """Pure verdict for spends in integer micro-USD at `now` (UTC epoch s), `held` (micro-USD held by requests in
    flight) counting as spent in both periods. A period is "exceeded" once spent >= limit, "soft" once
    spent * 100 >= limit * soft_limit_pct; a period without a limit is "ok"."""
    worst = BudgetVerdict("ok", budget.on_exceed, day_spent_micro_usd=day_spent, month_spent_micro_usd=month_spent,
                          held_micro_usd=held)
    periods: tuple[tuple[Period, int, int | None], ...] = (
        ("day", day_spent + held, budget.daily_usd),
        ("month", month_spent + held, budget.monthly_usd),
    )
    for period, spent, limit in periods:
        state = "ok" if limit is None else _state(spent, limit, budget.soft_limit_pct)
        if state == "ok" or limit is None or _RANK[state] < _RANK[worst.state]:
            continue  # on a tie the month (later in the loop) wins: it resets later
        resets = _period_end(datetime.fromtimestamp(now, UTC), period)
        retry = max(1, math.ceil(resets.timestamp() - now))
        worst = replace(
            worst,
            state=state,
            period=period,
            spent_micro_usd=spent,
            limit_micro_usd=limit,
            resets_at=resets,
            retry_after_s=retry,
        )
    return worst


class BudgetChecker(Protocol):
    """Holds a request's worst-case cost against its tenant's budget (see the module docstring). Never raises
    for a storage outage."""

    async def reserve(self, tenant: str, budget: Budget, hold_id: str, micro_usd: int) -> BudgetVerdict:
        """Where `tenant` stands, its requests in flight counted; unless "exceeded", `micro_usd` is held under
        `hold_id` (`verdict.held`) until the ledger records that request id or `release` is called."""
        ...

    async def release(self, tenant: str, hold_id: str) -> None:
        """Give back the hold of a request refused after admission (nothing when there is none)."""
        ...


@dataclass(frozen=True, slots=True)
class KeyHold:
    """Where an API key stands against its own daily budget: its spend of the UTC day and what its other requests
    in flight hold (micro-USD), and whether this request's worst case is now held."""

    spent_micro_usd: int
    held_micro_usd: int
    placed: bool

    def exceeded(self, limit: int) -> bool:
        return not self.placed and self.spent_micro_usd + self.held_micro_usd >= limit


class KeyBudget(Protocol):
    """An API key's own daily budget, held like a tenant's: `reserve_key` holds a request's worst case while the
    key's spend of the UTC day plus its holds are below `limit`; the ledger's record of that request id releases
    the hold (`gateway.ledger.keys.RECORD_LUA`), `release_key` one refused after admission. None: not checked
    (the store is unreachable)."""

    async def reserve_key(self, tenant: str, key_id: str, limit: int, hold_id: str,
                          micro_usd: int) -> KeyHold | None: ...

    async def release_key(self, tenant: str, key_id: str, hold_id: str) -> None: ...


def key_budget_error(tenant: str, key_id: str, spent: int, limit: int, now: float | None = None,
                     held: int = 0) -> BudgetExceeded:
    """The 429 of an API key past its own daily budget: it names the key, not the tenant's budget."""
    at = time.time() if now is None else now
    resets = _period_end(datetime.fromtimestamp(at, UTC), "day")
    more = f" (and {_usd(held)} USD more held by requests in flight)" if held else ""
    message = (f"Budget exceeded for API key {key_id!r} of tenant {tenant!r}: spent {_usd(spent)} USD{more} of the "
               f"key's daily budget of {_usd(limit)} USD; it resets at {resets:%Y-%m-%dT%H:%M:%SZ} (UTC).")
    return BudgetExceeded(message, max(1, math.ceil(resets.timestamp() - at)))


@dataclass(slots=True)
class BudgetGuardCounts:
    """What this process's guard did since start (for metrics and tests); not persisted."""

    reads: int = 0  # spend reads sent to Redis (one round trip each)
    cached: int = 0  # checks answered from the local cache
    fail_open: int = 0  # checks answered "ok" because Redis was unreachable
    soft_warnings: int = 0  # "soft" warnings logged (once per tenant and period)


@dataclass(slots=True)
class _Cached:
    fetched_at: float  # monotonic s
    month: str
    day: str
    month_spent: int
    day_spent: int


class BudgetGuard:
    """`BudgetChecker` on the ledger's spend counters in Redis (see the module docstring).

    `redis_client` is borrowed (the caller closes it); `keys` must be the ledger's `LedgerKeys` (same
    prefix). Spend read from Redis is reused for `cache_s` monotonic seconds per tenant (default 1 s; 0
    disables the cache) and never across a UTC day change. `clock` is UTC epoch seconds (tests inject it).
    `op_timeout_s`, `max_in_flight`, `retry_interval_s` and `warn_interval_s` configure the `FailOpen`
    (gateway.tenancy.limits) around every read. A hold not released expires after `hold_ttl_s` (default 15 min:
    longer than a request takes; shorter only lets a request overrunning it stop being counted early).
    """

    def __init__(
        self,
        redis_client: Any,
        keys: LedgerKeys,
        *,
        cache_s: float = 1.0,
        hold_ttl_s: float = 900.0,
        clock: Callable[[], float] = time.time,
        op_timeout_s: float = 0.5,
        max_in_flight: int = 32,
        retry_interval_s: float = 1.0,
        warn_interval_s: float = 30.0,
    ) -> None:
        self.counts = BudgetGuardCounts()
        self._client = redis_client
        self._keys = keys
        self._cache_s = cache_s
        self._clock = clock
        self._hold_ttl_ms = round(hold_ttl_s * 1000)
        self._hold = redis_client.register_script(HOLD_LUA)
        self._release = redis_client.register_script(RELEASE_LUA)
        self._cache: dict[str, _Cached] = {}
        self._legacy: dict[str, _Cached] = {}
        self._warned: dict[tuple[str, Period], str] = {}
        self._guard = FailOpen(
            "budget guard",
            op_timeout_s=op_timeout_s,
            max_in_flight=max_in_flight,
            retry_interval_s=retry_interval_s,
            warn_interval_s=warn_interval_s,
        )

    async def check(self, tenant: str, budget: Budget) -> BudgetVerdict:
        """Verdict for `tenant` now. No I/O when `budget` sets no limit or the cache is fresh; else one
        round trip (two HMGETs: both key layouts). Never raises for Redis trouble (fail open: "ok",
        `fail_open=True`)."""
        if budget.daily_usd is None and budget.monthly_usd is None:
            return BudgetVerdict("ok", budget.on_exceed)
        now = self._clock()
        spent = await self._spent(tenant, now)
        if spent is None:
            return BudgetVerdict("ok", budget.on_exceed, fail_open=True)
        verdict = evaluate(budget, spent.day_spent, spent.month_spent, now)
        if verdict.state == "soft" and verdict.period is not None:
            self._warn_soft(tenant, verdict.period, spent.day if verdict.period == "day" else spent.month, verdict)
        return verdict

    async def reserve(self, tenant: str, budget: Budget, hold_id: str, micro_usd: int) -> BudgetVerdict:
        """`BudgetChecker.reserve`: one round trip (the hold script), two when the spend of the layout before is
        read again (once per `cache_s`). No I/O when `budget` sets no limit."""
        if budget.daily_usd is None and budget.monthly_usd is None:
            return BudgetVerdict("ok", budget.on_exceed)
        now = self._clock()
        month, day = utc_periods(now)
        legacy = await self._legacy_spent(tenant, month, day)
        limits = ["" if limit is None else str(limit) for limit in (budget.daily_usd, budget.monthly_usd)]
        keys = [self._keys.spend(tenant, month), self._keys.holds(tenant), self._keys.hold_expiry(tenant)]
        args = [day, *limits, max(0, micro_usd), hold_id, self._hold_ttl_ms, legacy.day_spent, legacy.month_spent]
        reply = None if legacy.fetched_at < 0 else await self._guard.call(
            lambda: self._hold(keys=keys, args=args, client=self._client))
        if reply is None:
            self.counts.fail_open += 1
            return BudgetVerdict("ok", budget.on_exceed, fail_open=True)
        self.counts.reads += 1
        day_spent, month_spent, held, placed = (int(x) for x in reply)
        verdict = replace(evaluate(budget, day_spent, month_spent, now, held), held=bool(placed))
        if verdict.state == "soft" and verdict.period is not None:
            self._warn_soft(tenant, verdict.period, day if verdict.period == "day" else month, verdict)
        return verdict

    async def reserve_key(self, tenant: str, key_id: str, limit: int, hold_id: str,
                          micro_usd: int) -> KeyHold | None:
        """`KeyBudget.reserve_key`: the hold script on the key's spend of the day (`LedgerKeys.key_spend`, field
        `<key id>:cost_micro_usd`) and the key's own holds; one round trip."""
        day = utc_periods(self._clock())[1]
        keys = [self._keys.key_spend(tenant, day), self._keys.key_holds(tenant, key_id),
                self._keys.key_hold_expiry(tenant, key_id)]
        args = [f"{key_id}:cost_micro_usd", limit, "", max(0, micro_usd), hold_id, self._hold_ttl_ms, 0, 0]
        reply = await self._guard.call(lambda: self._hold(keys=keys, args=args, client=self._client))
        if reply is None:
            return None
        spent, _, held, placed = (int(x) for x in reply)
        return KeyHold(spent, held, bool(placed))

    async def release_key(self, tenant: str, key_id: str, hold_id: str) -> None:
        """`KeyBudget.release_key`: one round trip; on a Redis outage the hold expires by itself."""
        keys = [self._keys.key_holds(tenant, key_id), self._keys.key_hold_expiry(tenant, key_id)]
        await self._guard.call(lambda: self._release(keys=keys, args=[hold_id], client=self._client))

    async def release(self, tenant: str, hold_id: str) -> None:
        """`BudgetChecker.release`: one round trip; on a Redis outage the hold expires by itself."""
        keys = [self._keys.holds(tenant), self._keys.hold_expiry(tenant)]
        await self._guard.call(lambda: self._release(keys=keys, args=[hold_id], client=self._client))

    async def _legacy_spent(self, tenant: str, month: str, day: str) -> _Cached:
        """The tenant's spend in the key layout before (no hold script can read it: another slot), reused for
        `cache_s`; `fetched_at` < 0 when Redis could not be read."""
        mono = time.monotonic()
        hit = self._legacy.get(tenant)
        if hit is not None and hit.day == day and mono - hit.fetched_at < self._cache_s:
            return hit
        old = LegacyLedgerKeys(self._keys.prefix).spend(tenant, month)
        raw = await self._guard.call(lambda: self._client.hmget(old, [SPEND_MONTH_FIELD, day]))
        if raw is None:
            return _Cached(-1.0, month, day, 0, 0)
        fresh = _Cached(mono, month, day, int(raw[0] or 0), int(raw[1] or 0))
        self._legacy[tenant] = fresh
        return fresh

    async def _spent(self, tenant: str, now: float) -> _Cached | None:
        month, day = utc_periods(now)
        mono = time.monotonic()
        hit = self._cache.get(tenant)
        if hit is not None and hit.day == day and mono - hit.fetched_at < self._cache_s:
            self.counts.cached += 1
            return hit
        raw = await self._guard.call(lambda: read_spend(self._client, self._keys, tenant, month,
                                                        [SPEND_MONTH_FIELD, day]))
        if raw is None:
            self.counts.fail_open += 1
            return None
        self.counts.reads += 1
        fresh = _Cached(mono, month, day, raw[0], raw[1])
        self._cache[tenant] = fresh
        return fresh

    def _warn_soft(self, tenant: str, period: Period, period_id: str, verdict: BudgetVerdict) -> None:
        if self._warned.get((tenant, period)) == period_id:
            return
        self._warned[(tenant, period)] = period_id
        self.counts.soft_warnings += 1
        _log.warning(
            "tenant %r passed the soft limit of its %s budget %s: spent %s of %s USD",
            tenant,
            period,
            period_id,
            _usd(verdict.spent_micro_usd),
            _usd(verdict.limit_micro_usd),
        )


@dataclass
class StaticBudgets:
    """In-memory fake `BudgetChecker` for unit tests: spend per tenant set by the test, same `evaluate`.
    `spent[tenant] = (day_spent, month_spent)` in integer micro-USD; `held` the holds (no ledger releases them)."""

    spent: dict[str, tuple[int, int]] = field(default_factory=dict)
    clock: Callable[[], float] = time.time

    held: dict[str, dict[str, int]] = field(default_factory=dict)  # tenant -> hold id -> micro-USD

    async def check(self, tenant: str, budget: Budget) -> BudgetVerdict:
        day, month = self.spent.get(tenant, (0, 0))
        return evaluate(budget, day, month, self.clock())

    async def reserve(self, tenant: str, budget: Budget, hold_id: str, micro_usd: int) -> BudgetVerdict:
        if budget.daily_usd is None and budget.monthly_usd is None:
            return BudgetVerdict("ok", budget.on_exceed)
        day, month = self.spent.get(tenant, (0, 0))
        holds = self.held.setdefault(tenant, {})
        verdict = evaluate(budget, day, month, self.clock(), sum(holds.values()))
        if verdict.state == "exceeded" or micro_usd <= 0:
            return verdict
        holds[hold_id] = micro_usd
        return replace(verdict, held=True)

    async def release(self, tenant: str, hold_id: str) -> None:
        self.held.get(tenant, {}).pop(hold_id, None)
