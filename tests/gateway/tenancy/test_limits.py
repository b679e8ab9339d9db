"""Rate limiter tests against the shared Redis (unique key prefix per test, deleted afterwards): exact
admission under concurrency, Retry-After, the sliding window (with an injected clock), several limiters
and several OS processes sharing one limit, and fail-open on an unreachable Redis."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from gateway.errors import RateLimited
from gateway.tenancy.limits import MemoryRateLimiter, RateLimiter
from policies.schema import RateLimits
from tests.conftest import SHARED_URL
from tests.servers import PrivateRedis, free_port

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
Limiter = RateLimiter | MemoryRateLimiter
REPO = Path(__file__).resolve().parents[3]


class FakeClock:
    """UTC epoch seconds that only tests move."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now




@pytest.fixture
async def client() -> AsyncIterator[aioredis.Redis]:
    conn = aioredis.Redis.from_url(SHARED_URL)
    yield conn
    await conn.aclose()


def closed_port() -> int:
    return free_port()  # nothing listens once the probe socket is closed


async def admit_all(limiter: Limiter, n: int, limits: RateLimits, tokens: int) -> tuple[int, list[RateLimited]]:
    """Fire `n` concurrent admits; (admitted, the RateLimited errors). Any other error fails the test."""
    results = await asyncio.gather(*(limiter.admit("acme", limits, tokens) for _ in range(n)), return_exceptions=True)
    assert all(r is True or isinstance(r, BaseException) for r in results), results  # every admit was checked
    errors = [r for r in results if r is not True]
    assert all(isinstance(e, RateLimited) for e in errors), errors
    return n - len(errors), errors  # type: ignore[return-value]


async def outcome(limiter: Limiter, limits: RateLimits, tokens: int) -> int | RateLimited:
    """0 if admitted, else the error."""
    try:
        await limiter.admit("acme", limits, tokens)
    except RateLimited as exc:
        return exc
    return 0


# --- exactness under concurrency ------------------------------------------------------------------


@pytest.mark.redis
async def test_rpm_exact_under_200_concurrent_admits(client: aioredis.Redis, prefix: str) -> None:
    limiter = RateLimiter(client, prefix, op_timeout_s=5.0)
    admitted, errors = await admit_all(limiter, 200, RateLimits(requests_per_minute=37), tokens=10)
    assert admitted == 37 and len(errors) == 163
    assert all(e.status == 429 and e.type == "requests" and e.code == "rate_limit_exceeded" for e in errors)
    assert all(55 <= e.retry_after_s <= 60 for e in errors), {e.retry_after_s for e in errors}
    assert "Limit 37" in errors[0].message and "try again in" in errors[0].message
    assert (limiter.counts.admitted, limiter.counts.limited, limiter.counts.fail_open) == (37, 163, 0)
    log_key, _, _ = limiter.keys("acme")
    assert await client.zcard(log_key) == 37
    assert 0 < await client.pttl(log_key) <= 61_000


@pytest.mark.redis
async def test_tpm_exact_under_200_concurrent_admits(client: aioredis.Redis, prefix: str) -> None:
    limiter = RateLimiter(client, prefix, op_timeout_s=5.0)
    admitted, errors = await admit_all(limiter, 200, RateLimits(tokens_per_minute=1000), tokens=7)
    assert admitted == 1000 // 7
    assert all(e.type == "tokens" for e in errors)


@pytest.mark.redis
async def test_both_limits_the_tighter_one_binds(client: aioredis.Redis, prefix: str) -> None:
    limiter = RateLimiter(client, prefix, op_timeout_s=5.0)
    admitted, _ = await admit_all(limiter, 200, RateLimits(requests_per_minute=50, tokens_per_minute=300), 10)
    assert admitted == 30


@pytest.mark.redis
async def test_tenants_are_independent(client: aioredis.Redis, prefix: str) -> None:
    limiter = RateLimiter(client, prefix, op_timeout_s=5.0)
    limits = RateLimits(requests_per_minute=1)
    await limiter.admit("acme", limits, 1)
    await limiter.admit("globex", limits, 1)
    with pytest.raises(RateLimited):
        await limiter.admit("acme", limits, 1)


# --- sliding window and Retry-After, on Redis and on the in-memory fake ------------------------------


def both_limiters(client: aioredis.Redis, prefix: str, clock: FakeClock) -> list[Limiter]:
    return [RateLimiter(client, prefix, clock=clock, op_timeout_s=5.0), MemoryRateLimiter(clock=clock)]


@pytest.mark.redis
@pytest.mark.parametrize("impl", [0, 1], ids=["redis", "memory"])
async def test_rpm_window_slides_and_retry_after(client: aioredis.Redis, prefix: str, impl: int) -> None:
    clock = FakeClock()
    limiter = both_limiters(client, prefix, clock)[impl]
    limits = RateLimits(requests_per_minute=3)
    for at in (0.0, 10.0, 20.0):
        clock.now = T0 + at
        assert await outcome(limiter, limits, 1) == 0
    retries = []
    for at in (30.0, 59.9):  # the request admitted at 0 leaves the window at 60
        clock.now = T0 + at
        err = await outcome(limiter, limits, 1)
        assert isinstance(err, RateLimited)
        retries.append(err.retry_after_s)
    assert retries == [30, 1]
    clock.now = T0 + 60.0
    assert await outcome(limiter, limits, 1) == 0  # slid: 10, 20, 60 are in the window now
    err = await outcome(limiter, limits, 1)
    assert isinstance(err, RateLimited) and err.retry_after_s == 10
    clock.now = T0 + 200.0
    for _ in range(3):
        assert await outcome(limiter, limits, 1) == 0  # everything expired


@pytest.mark.redis
@pytest.mark.parametrize("impl", [0, 1], ids=["redis", "memory"])
async def test_tpm_retry_after_waits_for_enough_tokens(client: aioredis.Redis, prefix: str, impl: int) -> None:
    clock = FakeClock()
    limiter = both_limiters(client, prefix, clock)[impl]
    limits = RateLimits(tokens_per_minute=100)
    for at, tokens in ((0.0, 40), (10.0, 40), (20.0, 20)):
        clock.now = T0 + at
        assert await outcome(limiter, limits, tokens) == 0
    clock.now = T0 + 30.0
    err = await outcome(limiter, limits, 50)  # needs 50 freed: the 40 at 0 is not enough, 40 + 40 at 10 is
    assert isinstance(err, RateLimited) and err.type == "tokens" and err.retry_after_s == 40
    err = await outcome(limiter, limits, 30)  # 30 freed by the 40 at 0 alone
    assert isinstance(err, RateLimited) and err.retry_after_s == 30
    clock.now = T0 + 70.0
    assert await outcome(limiter, limits, 50) == 0  # both 40s left (at 60 and 70): 20 + 50 in the window
    clock.now = T0 + 75.0
    assert await outcome(limiter, limits, 30) == 0  # exactly 100 in the window
    err = await outcome(limiter, limits, 1)
    assert isinstance(err, RateLimited) and err.retry_after_s == 5  # the 20 admitted at 20 leaves at 80


@pytest.mark.redis
@pytest.mark.parametrize("impl", [0, 1], ids=["redis", "memory"])
async def test_a_request_given_back_no_longer_counts(client: aioredis.Redis, prefix: str, impl: int) -> None:
    clock = FakeClock()
    limiter = both_limiters(client, prefix, clock)[impl]
    limits = RateLimits(requests_per_minute=2, tokens_per_minute=100)
    first = await limiter.grant("acme", limits, 60)
    clock.now = T0 + 30.0
    await limiter.grant("acme", limits, 30)
    assert isinstance(await outcome(limiter, limits, 1), RateLimited)  # two requests in the minute
    await limiter.give_back("acme", first)
    await limiter.give_back("acme", first)  # once only: a second give-back changes nothing
    assert await outcome(limiter, limits, 70) == 0  # its request and its 60 tokens are free again: 30 + 70
    assert isinstance(await outcome(limiter, limits, 1), RateLimited)  # not freed twice
    clock.now = T0 + 61.0  # the given-back request and its copy have left the window, the others not yet
    assert isinstance(await outcome(limiter, limits, 1), RateLimited)  # its copy no longer subtracts anything
    clock.now = T0 + 200.0
    assert await outcome(limiter, limits, 100) == 0


@pytest.mark.redis
async def test_clock_going_back_never_reopens_the_window(client: aioredis.Redis, prefix: str) -> None:
    clock = FakeClock(T0 + 100.0)
    limiter = RateLimiter(client, prefix, clock=clock, op_timeout_s=5.0)
    limits = RateLimits(requests_per_minute=1)
    await limiter.admit("acme", limits, 1)
    clock.now = T0  # another process with a clock 100 s behind
    with pytest.raises(RateLimited) as info:
        await limiter.admit("acme", limits, 1)
    assert info.value.retry_after_s == 60  # measured on the newest clock seen, not a negative wait


async def test_request_larger_than_tpm_is_refused_without_redis() -> None:
    limiter = RateLimiter(aioredis.Redis(port=closed_port()), "x:")
    with pytest.raises(RateLimited) as info:
        await limiter.admit("acme", RateLimits(tokens_per_minute=100), 101)
    assert "Request too large" in info.value.message and info.value.retry_after_s == 60
    assert limiter.counts.fail_open == 0 and limiter.counts.limited == 1
    with pytest.raises(ValueError):
        await limiter.admit("acme", RateLimits(tokens_per_minute=100), -1)


async def test_no_limits_means_no_redis_call() -> None:
    limiter = RateLimiter(aioredis.Redis(port=closed_port()), "x:")
    for _ in range(5):
        await limiter.admit("acme", RateLimits(), 10**6)
    assert limiter.counts.fail_open == 0 and limiter.counts.admitted == 0


# --- several limiters, several processes ------------------------------------------------------------


@pytest.mark.redis
async def test_two_limiters_on_two_connections_share_one_limit(prefix: str) -> None:
    clients = [aioredis.Redis.from_url(SHARED_URL) for _ in range(2)]
    limiters = [RateLimiter(c, prefix, op_timeout_s=5.0) for c in clients]
    limits = RateLimits(requests_per_minute=50)
    counts = await asyncio.gather(*(admit_all(limiter, 100, limits, 1) for limiter in limiters))
    assert sum(admitted for admitted, _ in counts) == 50
    for c in clients:
        await c.aclose()


HAMMER = """
import asyncio, json, sys
import redis.asyncio as aioredis
from gateway.errors import RateLimited
from gateway.tenancy.limits import RateLimiter
from policies.schema import RateLimits

async def main(prefix: str) -> None:
    client = aioredis.Redis.from_url("redis://127.0.0.1:6379/0")
    limiter = RateLimiter(client, prefix, op_timeout_s=5.0)
    limits = RateLimits(requests_per_minute=120, tokens_per_minute=100_000)
    await client.ping()
    print("ready", flush=True)
    sys.stdin.readline()  # the go: both processes start firing at the same instant
    results = await asyncio.gather(*(limiter.admit("acme", limits, 5) for _ in range(150)), return_exceptions=True)
    assert all(r is True or isinstance(r, RateLimited) for r in results), results
    await client.aclose()
    print(json.dumps({"admitted": sum(r is True for r in results), "fail_open": limiter.counts.fail_open}))

asyncio.run(main(sys.argv[1]))
"""


def spawn(script: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, str(script), *args]
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def collect(procs: list[subprocess.Popen[str]]) -> list[dict[str, int]]:
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 0, stderr
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


@pytest.mark.redis
def test_two_os_processes_share_one_limit(tmp_path: Path, prefix: str) -> None:
    script = tmp_path / "hammer.py"
    script.write_text(HAMMER)
    procs = [spawn(script, prefix) for _ in range(2)]
    for proc in procs:  # both imported and connected
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n", proc.communicate(timeout=60)
    for proc in procs:  # the go
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    results = collect(procs)
    assert sum(r["admitted"] for r in results) == 120
    assert all(r["fail_open"] == 0 for r in results)


# --- Redis unreachable: fail open ---------------------------------------------------------------------


async def test_fail_open_when_redis_unreachable(caplog: pytest.LogCaptureFixture) -> None:
    limiter = RateLimiter(aioredis.Redis(port=closed_port()), "x:", retry_interval_s=60.0)
    limits = RateLimits(requests_per_minute=1)
    began = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="gateway.tenancy.limits"):
        for _ in range(50):
            assert await limiter.admit("acme", limits, 1) is False  # not checked; never raises, though the limit is 1
    assert time.monotonic() - began < 2.0, "an outage must not stall requests"
    assert limiter.counts.fail_open == 50 and limiter.counts.admitted == 0
    warnings = [r for r in caplog.records if "not checked" in r.getMessage()]
    assert len(warnings) == 1


@pytest.mark.redis
async def test_fail_open_then_enforces_again_when_redis_returns(
    stopped_redis: PrivateRedis, caplog: pytest.LogCaptureFixture
) -> None:
    conn = aioredis.Redis.from_url(stopped_redis.url)
    limiter = RateLimiter(conn, "t:", retry_interval_s=0.05)
    limits = RateLimits(requests_per_minute=1)
    try:
        with caplog.at_level(logging.WARNING, logger="gateway.tenancy.limits"):
            for _ in range(3):
                await limiter.admit("acme", limits, 1)  # down: all admitted unchecked
            stopped_redis.start()
            await asyncio.sleep(0.1)  # past the back-off
            assert await limiter.admit("acme", limits, 1) is True  # checked: the first in the window
            with pytest.raises(RateLimited):
                await limiter.admit("acme", limits, 1)
    finally:
        await conn.aclose()
    assert (limiter.counts.fail_open, limiter.counts.admitted, limiter.counts.limited) == (3, 1, 1)
    assert any("reachable again" in r.getMessage() for r in caplog.records)


@pytest.mark.redis
async def test_checks_resume_on_the_first_call_after_a_redis_restart(private_redis: PrivateRedis) -> None:
    conn = aioredis.Redis.from_url(private_redis.url)
    limiter = RateLimiter(conn, "t:", retry_interval_s=0.05)
    limits = RateLimits(requests_per_minute=1000)
    try:
        assert all(await asyncio.gather(*(limiter.admit("acme", limits, 1) for _ in range(8))))  # 8 connections
        private_redis.restart()
        # each pooled connection fails once ("closed by server"); one call retries past them
        assert await limiter.admit("acme", limits, 1) is True
    finally:
        await conn.aclose()
    assert limiter.counts.fail_open == 0
