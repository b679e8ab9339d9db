"""Figures of a load run: per group of samples (whole run, each phase) and per second, for the summary,
the JSON file and the plots. Pure functions over `Sample`s; no I/O."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from loadtest.load.client import Sample
from loadtest.load.stream_client import percentile

__all__ = ["per_second", "status_class", "summarise"]


def status_class(sample: Sample) -> str:
    """`ok`, `429`, `4xx`, `5xx`, `conn` (no HTTP answer) or `stream` (200 whose stream broke)."""
    if sample.ok:
        return "ok"
    if sample.status == 0:
        return "conn"
    if sample.status == 200:
        return "stream"
    if sample.status == 429:
        return "429"
    return "5xx" if sample.status >= 500 else "4xx"


def _pcts(values: list[float], scale: float = 1000.0) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for q in (50, 95, 99):
        v = percentile(values, q)
        out[f"p{q}"] = None if v is None else round(v * scale, 2)
    return out


def summarise(samples: Sequence[Sample], duration_s: float) -> dict[str, Any]:
    """Throughput, TTFT / ITL / e2e percentiles (ms) of admitted requests, errors by class, pool shares."""
    ok = [s for s in samples if s.ok]
    classes = Counter(status_class(s) for s in samples)
    rejected = [s for s in samples if s.status == 429]
    pools = Counter(s.pool or "-" for s in ok)
    tenants: dict[str, dict[str, int]] = {}
    for s in samples:
        row = tenants.setdefault(s.tenant, {"sent": 0, "ok": 0, "429": 0})
        row["sent"] += 1
        row["ok"] += s.ok
        row["429"] += s.status == 429
    tokens = sum(s.completion_tokens for s in ok)
    gaps = [g for s in ok for g in s.gaps_s]
    sent = len(samples)
    return {
        "sent": sent, "ok": len(ok), "duration_s": round(duration_s, 3),
        "throughput_rps": round(len(ok) / duration_s, 3) if duration_s > 0 else None,
        "tokens_per_s": round(tokens / duration_s, 1) if duration_s > 0 else None,
        "status": dict(Counter(str(s.status) for s in samples)),
        "classes": dict(classes),
        "error_rate": round((sent - len(ok)) / sent, 4) if sent else None,
        "rate_5xx": round(classes["5xx"] / sent, 4) if sent else None,
        "rejected_429": len(rejected),
        "retry_after_seen": sum(1 for s in rejected if s.retry_after),
        "retry_after_values": sorted({s.retry_after for s in rejected if s.retry_after}),
        "ttft_ms": _pcts([s.ttft_s for s in ok if s.ttft_s is not None]),
        "itl_ms": _pcts(gaps),
        "e2e_ms": _pcts([s.e2e_s for s in ok if s.e2e_s is not None]),
        "pool_share": {p: round(n / len(ok), 4) for p, n in sorted(pools.items())} if ok else {},
        "tenants": tenants,
        "kinds": dict(Counter(s.kind for s in samples)),
        "degraded_responses": sum(1 for s in samples if s.degraded),
        "error_examples": list(dict.fromkeys(s.error for s in samples if s.error))[:5],
    }


def per_second(samples: Sequence[Sample], bucket_s: float = 1.0) -> list[dict[str, Any]]:
    """One row per `bucket_s` of send time: sent, ok, 429, 5xx, other errors, TTFT p50/p99 (ms) of admitted."""
    if not samples:
        return []
    last = max(s.sent_s for s in samples)
    rows: list[dict[str, Any]] = [
        {"t": i * bucket_s, "sent": 0, "ok": 0, "429": 0, "5xx": 0, "other": 0, "_ttft": []}
        for i in range(math.floor(last / bucket_s) + 1)
    ]
    for s in samples:
        row = rows[int(s.sent_s // bucket_s)]
        row["sent"] += 1
        cls = status_class(s)
        key = cls if cls in ("ok", "429", "5xx") else "other"
        row[key] += 1
        if s.ok and s.ttft_s is not None:
            row["_ttft"].append(s.ttft_s)
    for row in rows:
        ttft = row.pop("_ttft")
        p50, p99 = percentile(ttft, 50), percentile(ttft, 99)
        row["ttft_p50_ms"] = None if p50 is None else round(p50 * 1000, 2)
        row["ttft_p99_ms"] = None if p99 is None else round(p99 * 1000, 2)
    return rows
