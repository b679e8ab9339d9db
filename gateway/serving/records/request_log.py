"""The replay log: one JSON line per finished request, for `cascade policy replay`.

Format (see `policies/replay.py`): {"request": <chat body>, "tenant", "score", "pool", "pool_version" (the
engine version that answered: the pool's or its canary's), "prompt_tokens", "completion_tokens", "route" (each step
that chose or changed the pool: {"step", "pool", "why"}, `policies.decide.RouteStep`), "tiers" (with routing.tiers:
every tier's prediction as the cost record's `tiers` holds it; "" without one)}. It holds
prompt text, so it is off by default and meant for a sample of traffic on a trusted disk (`--request-log-sample`:
each request is kept with that probability). Lines are appended
with one write each (atomic for lines under PIPE_BUF on Linux when several workers share the file); no fsync:
losing the tail of a replay log loses no money.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import orjson

from gateway.ledger.store import CostRecord
from gateway.serving.records.accounting import RequestFacts

__all__ = ["RequestLog"]


class RequestLog:
    """Appends sampled request lines to `path`: each request's with probability `sample`, in (0, 1]. Owns one file
    descriptor (`close`)."""

    def __init__(self, path: Path, sample: float = 1.0) -> None:
        if not 0 < sample <= 1:
            raise ValueError(f"the replay log's sample must be in (0, 1], got {sample}")
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._sample = sample

    def write(self, facts: RequestFacts, rec: CostRecord) -> None:
        if rec.status == "escalated" or (self._sample < 1.0 and random.random() >= self._sample):
            return
        route = [{"step": s.step, "pool": s.pool, "why": s.why} for s in facts.decision.route]
        line = {"request": facts.request, "tenant": rec.tenant, "score": facts.decision.score, "pool": rec.pool,
                "pool_version": rec.pool_version, "prompt_tokens": rec.prompt_tokens,
                "completion_tokens": rec.completion_tokens, "route": route, "tiers": rec.tiers}
        os.write(self._fd, orjson.dumps(line) + b"\n")

    def close(self) -> None:
        os.close(self._fd)
