"""What budget holds and the access log cost per request, in isolation (BENCHMARKS.md, "Budgets under
concurrency").

- a budget hold (`BudgetGuard.reserve`: one EVALSHA) against the spend read it replaced (`BudgetGuard.check`, cached
  for 1 s), sequential, on the Redis at `--redis-url` (keys under a fresh prefix, deleted after);
- the access log's `begin` + `answered` for one request, writing to /dev/null.

    .venv/bin/python -m loadtest.bench.admission_costs [--rounds 3] [--n 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid

import redis.asyncio as aioredis

from gateway.ledger.keys import LedgerKeys
from gateway.ledger.store import CostRecord
from gateway.serving.records.access_log import AccessLog
from gateway.tenancy.budgets import BudgetGuard
from policies.schema import Budget

__all__ = ["main"]


def _record(i: int) -> CostRecord:
    return CostRecord(request_id=f"req-{i}", tenant="acme", pool="micro", model="tiny", prompt_tokens=120,
                      completion_tokens=40, cost_micro_usd=31, flagship_cost_micro_usd=900, rule="score<0.50",
                      policy_version="v1", started_at=time.time(), ttft_ms=12.5, latency_ms=80.25)


def access_log_us(n: int) -> float:
    """CPU microseconds per request of the access log's two calls."""
    log, recs = AccessLog("/dev/null"), [_record(i) for i in range(n)]
    began = time.process_time()
    for rec in recs:
        log.begin(rec.request_id, "0123456789ab", "chat")
        log.answered(rec)
    log.close()
    return (time.process_time() - began) / n * 1e6


async def holds_us(url: str, n: int) -> tuple[float, float, float]:
    """(CPU us, wall us) per `reserve`, and CPU us per cached `check`, over `n` sequential calls each."""
    client = aioredis.Redis.from_url(url)
    prefix = f"bench:{uuid.uuid4().hex}:"
    guard, budget = BudgetGuard(client, LedgerKeys(prefix), op_timeout_s=5.0), Budget.model_validate(
        {"daily_usd": "1000"})
    try:
        cpu, wall = time.process_time(), time.perf_counter()
        for i in range(n):
            await guard.reserve("acme", budget, f"r-{i}", 500)
        reserve_cpu, reserve_wall = time.process_time() - cpu, time.perf_counter() - wall
        cpu = time.process_time()
        for _ in range(n):
            await guard.check("acme", budget)
        check_cpu = time.process_time() - cpu
    finally:
        async for key in client.scan_iter(match=prefix + "*"):
            await client.delete(key)
        await client.aclose()
    return reserve_cpu / n * 1e6, reserve_wall / n * 1e6, check_cpu / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--n", type=int, default=2000)
    args = parser.parse_args()
    for _ in range(args.rounds):
        reserve_cpu, reserve_wall, check_cpu = asyncio.run(holds_us(args.redis_url, args.n))
        print(f"hold: {reserve_cpu:.0f} us CPU, {reserve_wall:.0f} us wall; cached spend read: {check_cpu:.0f} us CPU; "
              f"access log: {access_log_us(args.n * 10):.1f} us CPU")


if __name__ == "__main__":
    main()
