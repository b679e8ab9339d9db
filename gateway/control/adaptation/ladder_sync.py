"""One degradation ladder for every gateway process that shares a Redis (and key prefix).

Every tick each process publishes what only it can see (its own requests' TTFTs and errors of the last
window, per pool) and tries to hold a leader lease. The leader merges all fresh reports with the engine
signals it scrapes itself (every process scrapes the same engines), runs the ladder (hysteresis and hold
times unchanged) and writes the active steps; a Lua script lets only the current lease holder write.
Followers adopt the written state. A process that becomes leader starts from the shared state, so a
leader change keeps the steps' entry times. Entry times cross processes as UTC epoch seconds and are
mapped to each process's monotonic clock.

Keys under `<prefix>ladder:{sync}:` (one hash tag: the lease script reads `leader` and writes `state` in one
slot, so it also runs on Redis Cluster): `leader` (process id, PX lease), `state` (JSON {"active": {step:
epoch}, "at": epoch}), `reports` (hash process id -> JSON report). Processes of a version that used the
untagged `<prefix>ladder:leader` keys keep a ladder of their own until they are replaced.
"""

from __future__ import annotations

import logging
import math
import os
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import orjson
import redis.asyncio as aioredis

from gateway.telemetry.percentile import nearest_rank

__all__ = ["LadderSync", "Report", "merge_reports"]

log = logging.getLogger("cascade.ladder_sync")

_HOLD_LEASE = """
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end
if not cur then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 2 end
return 0
"""
_WRITE_IF_LEADER = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[2])
return 1
"""
MAX_SAMPLES = 256  # newest TTFTs per pool per report: exact p95 at low rates, a recent sample at high


@dataclass(frozen=True, slots=True)
class Report:
    """One process's own view, per pool: TTFT samples (s) and (errors, requests) of the last window, and the
    requests it has in flight now."""

    ttft: Mapping[str, list[float]]
    outcomes: Mapping[str, tuple[int, int]]
    in_flight: Mapping[str, int] = field(default_factory=dict)

    def dumps(self, at: float) -> bytes:
        return orjson.dumps({"at": at, "ttft": self.ttft, "outcomes": self.outcomes, "in_flight": self.in_flight})


def merge_reports(reports: Iterable[Report]) -> dict[tuple[str, str], float]:
    """`ttft_p95_s` over the union of the samples, `error_rate` over all requests and `in_flight` summed over
    the processes, per pool."""
    samples: dict[str, list[float]] = {}
    outcomes: dict[str, tuple[int, int]] = {}
    in_flight: dict[str, int] = {}
    for report in reports:
        for pool, count in report.in_flight.items():
            in_flight[pool] = in_flight.get(pool, 0) + count
        for pool, values in report.ttft.items():
            samples.setdefault(pool, []).extend(values)
        for pool, (errors, total) in report.outcomes.items():
            e, t = outcomes.get(pool, (0, 0))
            outcomes[pool] = (e + errors, t + total)
    out: dict[tuple[str, str], float] = {("ttft_p95_s", p): nearest_rank(v, 0.95) for p, v in samples.items()}
    out |= {("error_rate", p): (e / t if t else math.nan) for p, (e, t) in outcomes.items()}
    out |= {("in_flight", p): float(n) for p, n in in_flight.items()}
    return out


class LadderSync:
    """The Redis side of a shared ladder for one process. Shares (does not own) the Redis client."""

    def __init__(self, redis: aioredis.Redis, prefix: str, lease_s: float = 3.0, stale_s: float = 5.0) -> None:
        self._redis = redis
        self._leader_key = f"{prefix}ladder:{{sync}}:leader"
        self._state_key = f"{prefix}ladder:{{sync}}:state"
        self._reports_key = f"{prefix}ladder:{{sync}}:reports"
        self._lease_ms = int(lease_s * 1000)
        self._stale_s = stale_s
        self.me = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"

    async def publish(self, report: Report) -> None:
        await self._redis.hset(self._reports_key, self.me, report.dumps(time.time()))

    async def hold_lease(self) -> int:
        """2: became leader now, 1: still leader, 0: another process leads."""
        return int(await self._redis.eval(_HOLD_LEASE, 1, self._leader_key, self.me, self._lease_ms))

    async def reports(self) -> list[Report]:
        """Every report younger than `stale_s`; older ones (stopped processes) are deleted."""
        now = time.time()
        fresh: list[Report] = []
        stale: list[bytes | str] = []
        for key, raw in (await self._redis.hgetall(self._reports_key)).items():
            data = orjson.loads(raw)
            if now - float(data["at"]) > self._stale_s:
                stale.append(key)
                continue
            outcomes = {p: (int(e), int(t)) for p, (e, t) in data["outcomes"].items()}
            in_flight = {p: int(n) for p, n in (data.get("in_flight") or {}).items()}  # absent: an older worker
            fresh.append(Report(data["ttft"], outcomes, in_flight))
        if stale:
            await self._redis.hdel(self._reports_key, *stale)
        return fresh

    async def write_state(self, active_since_epoch: Mapping[str, float]) -> bool:
        """Write the active steps if this process still holds the lease; False when it lost it."""
        body = orjson.dumps({"active": dict(active_since_epoch), "at": time.time()})
        written = await self._redis.eval(_WRITE_IF_LEADER, 2, self._leader_key, self._state_key, self.me, body)
        return bool(written)

    async def read_state(self) -> dict[str, float] | None:
        """Active steps -> entry time (UTC epoch seconds) as the leader last wrote them, or None."""
        raw = await self._redis.get(self._state_key)
        if raw is None:
            return None
        return {str(k): float(v) for k, v in orjson.loads(raw)["active"].items()}
