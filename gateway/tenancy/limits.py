"""Per-tenant rate limits (requests and tokens per sliding minute), shared by every gateway process
through Redis.

Algorithm: an exact sliding log. Each admitted request is one member of a sorted set per tenant, scored
by its admission time in microseconds (Redis server time, so every process shares one clock); a request
is admitted when, over the last 60 s, (admitted requests + 1) <= requests_per_minute and (admitted
tokens + its tokens) <= tokens_per_minute. One Lua script per admit checks and inserts atomically, so
exactly N of any number of concurrent admits get in. Token sums stay O(1): each member carries the
running total of tokens admitted so far (`seq:cumulative:tokens`), so the window's sum is the newest
total minus the oldest member's total before it, and Retry-After (when the oldest members that must
leave the window have left) is a binary search over ranks, O(log n). Rejected requests leave no trace.

Tokens are the caller's reservation (prompt estimate + max completion tokens), as OpenAI counts them;
there is no refund once real usage is known (a refund would have to rewrite every later member). A request
refused after admission is given back whole (`give_back`): its member is copied, with its score, to a third key
of given-back members, which the admit script subtracts (count and tokens; they leave the window together).
Given-back members are few (refusals), so summing them is cheap. Retry-After still counts them as leaving the
window: it can be early by their share, and a retry then gets a fresh 429 with a fresh wait.

Redis unreachable (error or `op_timeout_s`): `admit` returns False (not checked) instead of raising,
`counts.fail_open` grows, a warning is logged at most once per `warn_interval_s`, and Redis is not asked
again for `retry_interval_s` (no request waits on a dead Redis more than once per interval). Whether an
unchecked request goes on is the tenant's `on_redis_outage` policy, applied by `gateway.tenancy.admission`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.errors import RateLimited
from gateway.logs import LogThrottle
from gateway.redis_client import REDIS_FAILURES
from policies.schema import RateLimits

__all__ = ["FailOpen", "Grant", "Limiter", "MemoryRateLimiter", "RateLimiter", "RateLimiterCounts",
           "retry_stale_connections"]

_log = logging.getLogger(__name__)
T = TypeVar("T")

WINDOW_S = 60
_ATTEMPTS = 4  # per `FailOpen.call`, on connection errors only, all within its `op_timeout_s`

# KEYS[1] log (zset: member `seq:cumulative_tokens:tokens`, score admission time in us), KEYS[2] meta hash
# (last: newest admission us, seq, cum: tokens admitted ever), KEYS[3] given-back members (zset, as the log).
# ARGV: window_us, rpm, tpm (0 = no limit), tokens, now_us ('' = Redis TIME). Returns {1, 0, 0, member}
# admitted or {0, wait_us, binding} with binding 1 = requests, 2 = tokens. Numbers go back to Redis through
# %d: tostring() would print 1.7e+15.
_ADMIT_LUA = """#!lua
local window, rpm, tpm, tokens = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local now
if ARGV[5] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[5])
end
local meta = redis.call('HMGET', KEYS[2], 'last', 'seq', 'cum')
local last, seq, cum = tonumber(meta[1]) or 0, tonumber(meta[2]) or 0, tonumber(meta[3]) or 0
if now < last then now = last end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now - window))
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', string.format('%d', now - window))
local back = redis.call('ZRANGE', KEYS[3], 0, -1)
local back_tokens = 0
for _, m in ipairs(back) do back_tokens = back_tokens + tonumber(string.match(m, ':(%d+)$')) end
local function entry(rank)
  local got = redis.call('ZRANGE', KEYS[1], rank, rank, 'WITHSCORES')
  local c, n = string.match(got[1], '^%d+:(%d+):(%d+)$')
  return tonumber(c), tonumber(n), tonumber(got[2])
end
local count, base = redis.call('ZCARD', KEYS[1]), cum
if count > 0 then
  local c, n = entry(0)
  base = c - n
end
local need_r, need_t = 0, 0
if rpm > 0 then need_r = count - #back + 1 - rpm end
if tpm > 0 then need_t = cum - base - back_tokens + tokens - tpm end
if need_r <= 0 and need_t <= 0 then
  seq, cum = seq + 1, cum + tokens
  local member = string.format('%016d:%d:%d', seq, cum, tokens)
  redis.call('ZADD', KEYS[1], string.format('%d', now), member)
  redis.call('HSET', KEYS[2], 'last', string.format('%d', now), 'seq', seq, 'cum', string.format('%d', cum))
  local ttl = string.format('%d', math.floor(window / 1000) + 1000)
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('PEXPIRE', KEYS[2], ttl)
  return {1, 0, 0, member}
end
local rank, binding = need_r - 1, 1
if need_t > 0 then
  local lo, hi = 0, count - 1
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if entry(mid) - base >= need_t then hi = mid else lo = mid + 1 end
  end
  if lo > rank then rank, binding = lo, 2 end
end
local _, _, score = entry(rank)
return {0, score + window - now, binding}
"""

# KEYS: log, given-back members. ARGV: the member to give back. Copies it with its score (once; nothing when it
# has left the window) and lets the copy expire with the log.
_GIVE_BACK_LUA = """#!lua
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score then return 0 end
redis.call('ZADD', KEYS[2], 'NX', score, ARGV[1])
local ttl = redis.call('PTTL', KEYS[1])
if ttl > 0 then redis.call('PEXPIRE', KEYS[2], ttl) end
return 1
"""


@dataclass(slots=True)
class RateLimiterCounts:
    """What this process's limiter did since start (for metrics and tests); not persisted."""

    admitted: int = 0  # checked in Redis and admitted
    limited: int = 0  # rejected with `RateLimited`
    fail_open: int = 0  # not checked because Redis was unreachable (`admit` returned False)


async def retry_stale_connections(fn: Callable[[], Awaitable[T]], attempts: int) -> T:
    """`await fn()`, tried up to `attempts` times when the connection itself fails: after Redis restarts, each
    pooled connection opened before fails once ("closed by server") and is reopened by redis-py, so a retry on
    the next one succeeds (without it each stale connection would stop `FailOpen`'s checks for its
    `retry_interval_s`, or fail a readiness probe). A refused connection fails in microseconds, so the retries
    cost nothing during an outage."""
    for _ in range(attempts - 1):
        try:
            return await fn()
        except RedisConnectionError:
            continue
    return await fn()


class FailOpen:
    """Runs optional Redis calls so that they fail open: `call` returns None instead of raising when Redis
    errs or the call (waiting for one of `max_in_flight` slots included) takes over `op_timeout_s`.

    After Redis itself failed, `call` returns None at once for `retry_interval_s` (monotonic seconds):
    no request waits on a dead Redis more than once per interval. A call that only waited too long for a
    local slot (a burst) fails open alone. Warnings are logged at most once per `warn_interval_s`. The
    slots keep the borrowed client under its `max_connections` (redis-py 8 raises `MaxConnectionsError`
    instead of waiting; default 100). Owns no connection; used from one event loop.
    """

    def __init__(
        self,
        what: str,
        *,
        op_timeout_s: float = 0.5,
        max_in_flight: int = 32,
        retry_interval_s: float = 1.0,
        warn_interval_s: float = 30.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._what = what
        self._timeout = op_timeout_s
        self._slots = asyncio.Semaphore(max_in_flight)
        self._retry = retry_interval_s
        self._warnings = LogThrottle(warn_interval_s, monotonic)
        self._now = monotonic
        self._down_until = -math.inf
        self._down = False

    async def call(self, fn: Callable[[], Awaitable[T]]) -> T | None:
        """`await fn()`, or None when it must fail open (see the class docstring). Never raises Redis,
        socket or timeout errors; other exceptions (bugs) propagate."""
        if self._now() < self._down_until:
            return None
        in_redis = False
        try:
            async with asyncio.timeout(self._timeout), self._slots:
                in_redis = True
                result = await retry_stale_connections(fn, _ATTEMPTS)
        except REDIS_FAILURES as exc:  # TimeoutError (ours, from asyncio.timeout) is an OSError
            self._failed(exc, trip=in_redis)
            return None
        if self._down:
            self._down = False
            _log.warning("%s: Redis reachable again; enforcing", self._what)
        return result

    def _failed(self, exc: BaseException, *, trip: bool) -> None:
        now = self._now()
        if trip:
            self._down_until = now + self._retry
            self._down = True
        if self._warnings.due("redis") is not None:
            _log.warning("%s: Redis unreachable or slow (%r); not checked (each tenant's on_redis_outage "
                         "decides)", self._what, exc)


@dataclass(frozen=True, slots=True)
class Grant:
    """One request's admission: `checked` False when the store was unreachable; `member` what it took (None:
    nothing, so nothing to give back)."""

    checked: bool
    member: str | None = None


class Limiter(Protocol):
    """Admits requests under a tenant's limits; gives back a request refused after admission."""

    async def grant(self, tenant: str, limits: RateLimits, tokens: int) -> Grant:
        """Admit a request of `tokens` (prompt estimate + max completion tokens) for `tenant` under `limits`, or
        raise `RateLimited`. Never raises for a storage outage (`Grant.checked` False)."""
        ...

    async def give_back(self, tenant: str, grant: Grant) -> None:
        """Undo `grant` (the request was refused after admission): it no longer counts in the window. Once only;
        never raises for a storage outage."""
        ...


class RateLimiter:
    """`Limiter` on Redis (see the module docstring for the algorithm and the fail-open rule).

    `redis_client` is borrowed: the caller owns and closes it; it may share it with other users. Keys:
    `{key_prefix}rl:{<tenant>}:log` (zset), `{key_prefix}rl:{<tenant>}:meta` (hash) and
    `{key_prefix}rl:{<tenant>}:back` (zset, given back), the tenant between literal braces (a Redis Cluster hash
    tag: one slot), all with a TTL of 61 s after the tenant's last admission.
    `clock` (UTC epoch seconds) replaces Redis server time: for tests; every process sharing a tenant
    must then use the same clock. `op_timeout_s`, `max_in_flight`, `retry_interval_s` and
    `warn_interval_s` configure the `FailOpen` around every script call.
    """

    def __init__(
        self,
        redis_client: Any,
        key_prefix: str = "cascade:",
        *,
        clock: Callable[[], float] | None = None,
        op_timeout_s: float = 0.5,
        max_in_flight: int = 32,
        retry_interval_s: float = 1.0,
        warn_interval_s: float = 30.0,
    ) -> None:
        self.counts = RateLimiterCounts()
        self._client = redis_client
        self._prefix = key_prefix
        self._clock = clock
        self._script = redis_client.register_script(_ADMIT_LUA)
        self._give_back = redis_client.register_script(_GIVE_BACK_LUA)
        self._guard = FailOpen(
            "rate limiter",
            op_timeout_s=op_timeout_s,
            max_in_flight=max_in_flight,
            retry_interval_s=retry_interval_s,
            warn_interval_s=warn_interval_s,
        )

    def keys(self, tenant: str) -> tuple[str, str, str]:
        """(log, meta, given back) keys of a tenant."""
        tag = f"{self._prefix}rl:{{{tenant}}}:"
        return f"{tag}log", f"{tag}meta", f"{tag}back"

    async def admit(self, tenant: str, limits: RateLimits, tokens: int) -> bool:
        """`grant`, telling only whether the limits were checked (True) or Redis was unreachable (False)."""
        return (await self.grant(tenant, limits, tokens)).checked

    async def grant(self, tenant: str, limits: RateLimits, tokens: int) -> Grant:
        """Admit one request of `tokens` >= 0 or raise `RateLimited` (its `retry_after_s`: whole seconds
        until it would fit, if nothing else is admitted meanwhile). No Redis call when `limits` sets
        nothing; one round trip (EVALSHA) otherwise. On a Redis outage `checked` is False (not checked)."""
        rpm, tpm = limits.requests_per_minute or 0, limits.tokens_per_minute or 0
        if tokens < 0:
            raise ValueError(f"tokens must be >= 0, got {tokens}")
        if not rpm and not tpm:
            return Grant(True)
        if tpm and tokens > tpm:
            self.counts.limited += 1
            raise _too_large(tenant, tpm, tokens)
        reply = await self._guard.call(lambda: self._run(tenant, rpm, tpm, tokens))
        if reply is None:
            self.counts.fail_open += 1
            return Grant(False)
        admitted, wait_us, binding = (int(x) for x in reply[:3])
        if admitted:
            self.counts.admitted += 1
            member = reply[3]
            return Grant(True, member.decode() if isinstance(member, bytes) else str(member))
        self.counts.limited += 1
        raise _limited(tenant, rpm if binding == 1 else tpm, tokens, binding == 1, wait_us)

    async def give_back(self, tenant: str, grant: Grant) -> None:
        """`Limiter.give_back`: one round trip when `grant` took something; on an outage the request keeps
        counting until it leaves the window."""
        if grant.member is None:
            return
        log, _, back = self.keys(tenant)
        member = grant.member
        await self._guard.call(lambda: self._give_back(keys=[log, back], args=[member], client=self._client))

    async def _run(self, tenant: str, rpm: int, tpm: int, tokens: int) -> Any:
        now = "" if self._clock is None else str(round(self._clock() * 1_000_000))
        args = [WINDOW_S * 1_000_000, rpm, tpm, tokens, now]
        return await self._script(keys=list(self.keys(tenant)), args=args, client=self._client)


class MemoryRateLimiter:
    """In-process fake of `RateLimiter` for unit tests: the same sliding-log rule and errors, one process
    only. `clock` is UTC epoch seconds (default `time.time`)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._logs: dict[str, deque[tuple[float, int, int]]] = {}  # (admitted at, tokens, sequence number)
        self._seq = 0

    async def admit(self, tenant: str, limits: RateLimits, tokens: int) -> bool:
        return (await self.grant(tenant, limits, tokens)).checked

    async def give_back(self, tenant: str, grant: Grant) -> None:
        log = self._logs.get(tenant)
        if log is not None and grant.member is not None:
            for entry in log:
                if str(entry[2]) == grant.member:
                    log.remove(entry)
                    return

    async def grant(self, tenant: str, limits: RateLimits, tokens: int) -> Grant:
        rpm, tpm = limits.requests_per_minute or 0, limits.tokens_per_minute or 0
        if tpm and tokens > tpm:
            raise _too_large(tenant, tpm, tokens)
        now = self._clock()
        log = self._logs.setdefault(tenant, deque())
        while log and log[0][0] <= now - WINDOW_S:
            log.popleft()
        waits: list[tuple[float, bool, int]] = []
        if rpm and len(log) + 1 > rpm:
            waits.append((log[len(log) - rpm][0] + WINDOW_S - now, True, rpm))
        need, freed = sum(n for _, n, _ in log) + tokens - tpm, 0
        for when, n, _ in log if tpm and need > 0 else ():
            freed += n
            if freed >= need:
                waits.append((when + WINDOW_S - now, False, tpm))
                break
        if waits:
            wait_s, requests, limit = max(waits)
            raise _limited(tenant, limit, tokens, requests, round(wait_s * 1e6))
        if not rpm and not tpm:
            return Grant(True)
        self._seq += 1
        log.append((now, tokens, self._seq))
        return Grant(True, str(self._seq))


def _limited(tenant: str, limit: int, tokens: int, requests: bool, wait_us: int) -> RateLimited:
    retry = max(1, math.ceil(wait_us / 1_000_000))
    what, requested = ("requests per min (RPM)", 1) if requests else ("tokens per min (TPM)", tokens)
    message = (
        f"Rate limit reached for tenant {tenant!r} on {what}: Limit {limit}, Requested {requested}. "
        f"Please try again in {retry}s."
    )
    return RateLimited(message, retry, type_="requests" if requests else "tokens")


def _too_large(tenant: str, tpm: int, tokens: int) -> RateLimited:
    message = (
        f"Request too large for tenant {tenant!r} on tokens per min (TPM): Limit {tpm}, Requested {tokens}. "
        "Reduce the prompt or max_tokens; retrying will not help."
    )
    return RateLimited(message, WINDOW_S, type_="tokens")
