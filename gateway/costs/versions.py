"""Engine versions of one pool side by side, from the ledger: `cascade pool compare POOL`.

Every cost record names the engine version that answered it (`pool_version`: the pool's own or its canary's,
`policies.pools.engine_version`), so the ledger's record stream holds what a canary is judged on, for every
worker and gateway that shares the Redis: requests, failures, time to first token, the gap between tokens,
latency, escalation rate, cost, and the feedback clients sent (`POST /v1/feedback`).

The gap between tokens is per request, (latency - TTFT) / (completion tokens - 1), for streamed answers of more
than one token. Percentiles are nearest rank.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import redis.asyncio as aioredis

from gateway.costs.report import stream_records
from gateway.ledger.keys import LedgerKeys
from gateway.ledger.record import CostRecord
from gateway.telemetry.percentile import nearest_rank
from router_models.training.ledger_labels import LabelKeys

__all__ = ["VersionFigures", "compare_versions", "figures", "render_comparison"]


@dataclass(slots=True)
class VersionFigures:
    """What the ledger holds of one engine version of a pool over the window."""

    version: str
    model: str = ""
    requests: int = 0
    errors: int = 0
    escalated: int = 0
    cost_micro_usd: int = 0
    tokens: int = 0
    ttft_ms: list[float] = field(default_factory=list)
    itl_ms: list[float] = field(default_factory=list)
    latency_ms: list[float] = field(default_factory=list)
    feedback: list[float] = field(default_factory=list)

    def add(self, rec: CostRecord) -> None:
        self.model = rec.model
        self.requests += 1
        self.errors += rec.status == "upstream_error"
        self.escalated += rec.status == "escalated"
        self.cost_micro_usd += rec.cost_micro_usd
        self.tokens += rec.prompt_tokens + rec.completion_tokens
        self.latency_ms.append(rec.latency_ms)
        if rec.ttft_ms is not None:
            self.ttft_ms.append(rec.ttft_ms)
            if rec.completion_tokens > 1:
                self.itl_ms.append((rec.latency_ms - rec.ttft_ms) / (rec.completion_tokens - 1))


def figures(records: Sequence[CostRecord], pool: str, feedback: Mapping[str, float] | None = None) -> list[
        VersionFigures]:
    """Per engine version of `pool` (records without a version, from before versions were recorded, are
    "unknown"), most requests first. `feedback`: request id -> score (0..1)."""
    by: dict[str, VersionFigures] = {}
    for rec in records:
        if rec.pool != pool or rec.status == "shadow":
            continue
        version = rec.pool_version or "unknown"
        one = by.setdefault(version, VersionFigures(version))
        one.add(rec)
        if feedback and rec.request_id in feedback:
            one.feedback.append(feedback[rec.request_id])
    return sorted(by.values(), key=lambda f: -f.requests)


async def compare_versions(client: aioredis.Redis, prefix: str, pool: str, hours: float,
                           now: float | None = None) -> list[VersionFigures]:
    """`figures` of the records the ledger added in the last `hours`. Raises `RedisError`."""
    keys, labels = LedgerKeys(prefix), LabelKeys(prefix)
    start_ms = int(((now or time.time()) - hours * 3600) * 1000)
    records = [rec async for _, rec in stream_records(client, keys, start_ms) if rec is not None and rec.pool == pool]
    async with client.pipeline(transaction=False) as pipe:
        for rec in records:
            pipe.hget(labels.feedback(rec.request_id), "score")
        scores = await pipe.execute() if records else []
    feedback = {rec.request_id: float(s) for rec, s in zip(records, scores, strict=True) if s is not None}
    return figures(records, pool, feedback)


def _pct(values: list[float], q: float) -> str:
    return f"{nearest_rank(values, q):.0f}" if values else "-"


def render_comparison(pool: str, rows: Sequence[VersionFigures], roles: Mapping[str, str], hours: float) -> str:
    """A table, one row per version; `roles` names the versions the policy runs now ("pool", "canary")."""
    if not rows:
        return f"pool {pool}: no requests in the ledger over the last {hours:g} h"
    head = ("version", "role", "model", "requests", "errors", "escalated", "ttft p50/p95 ms", "itl p50 ms",
            "latency p95 ms", "usd/1k req", "feedback")
    lines = [head]
    for f in rows:
        n = max(f.requests, 1)
        score = f"{sum(f.feedback) / len(f.feedback):.2f} ({len(f.feedback)})" if f.feedback else "-"
        lines.append((f.version, roles.get(f.version, "earlier"), f.model, str(f.requests), f"{f.errors / n:.1%}",
                      f"{f.escalated / n:.1%}", f"{_pct(f.ttft_ms, 0.5)}/{_pct(f.ttft_ms, 0.95)}",
                      _pct(f.itl_ms, 0.5), _pct(f.latency_ms, 0.95), f"{f.cost_micro_usd / n / 1000:.4f}", score))
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    text = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in lines]
    return f"pool {pool}, last {hours:g} h (ledger records; percentiles nearest rank)\n" + "\n".join(text)
