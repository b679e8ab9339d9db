"""Replay recorded traffic against a policy: which requests would move between pools, at what cost.

The log is JSON Lines, one request per line, exactly as the gateway writes it when request logging is on::

    {"request": {...chat-completions body...}, "tenant": "acme", "score": 0.42, "pool": "micro",
     "prompt_tokens": 812, "completion_tokens": 95}

- `request`: the client's body as received (model, messages, tools, response_format, metadata, ...);
- `tenant`: the authenticated tenant; `pool`: where the gateway sent it;
- `score`: the classifier's score, or null when none was computed (pinned model, pool rule);
- `prompt_tokens`, `completion_tokens`: the usage recorded for the request (integers >= 0);
- optional `headers`: {name: value} of request headers, for rules that match on headers.

Replaying assumes the same usage wherever a request goes (the completion length of another model is
unknown) and re-uses the recorded score; a request that now needs a score but has none is decided
without one (and counted as `unscored`).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from policies.context import RouteContext
from policies.decide import ModelNotRouted, PoolNotAllowed, decide, known_model, needs_score
from policies.loader import LoadedPolicy

__all__ = ["LogEntry", "LogError", "ReplayResult", "parse_line", "parse_log", "render_replay", "replay", "usd"]

REFUSED = "(refused)"


class LogError(ValueError):
    """A request log line that does not follow the format in the module docstring."""


@dataclass(frozen=True, slots=True)
class LogEntry:
    request: dict[str, Any]
    tenant: str
    score: float | None
    pool: str
    prompt_tokens: int
    completion_tokens: int
    headers: dict[str, str] = field(default_factory=dict)


def _entry(obj: Any) -> LogEntry:
    if not isinstance(obj, dict) or not isinstance(obj.get("request"), dict):
        raise ValueError("expected an object with a `request` object")
    for key in ("prompt_tokens", "completion_tokens"):
        if not isinstance(obj.get(key), int) or obj[key] < 0:
            raise ValueError(f"`{key}` must be an integer >= 0")
    score = obj.get("score")
    if score is not None and not isinstance(score, int | float):
        raise ValueError("`score` must be a number or null")
    headers = obj.get("headers") or {}
    return LogEntry(obj["request"], str(obj.get("tenant") or "default"), None if score is None else float(score),
                    str(obj.get("pool") or ""), obj["prompt_tokens"], obj["completion_tokens"],
                    {str(k): str(v) for k, v in headers.items()})


def parse_line(line: str) -> LogEntry:
    """One log line as an entry. Raises ValueError (bad JSON or a field not in the format above)."""
    return _entry(json.loads(line))


def parse_log(lines: Iterable[str], source: str = "<log>") -> list[LogEntry]:
    """Entries of a JSON Lines log (blank lines skipped). Raises `LogError` naming source:line."""
    entries = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            entries.append(_entry(json.loads(line)))
        except ValueError as exc:  # json.JSONDecodeError is a ValueError
            raise LogError(f"{source}:{number}: {exc}") from exc
    return entries


@dataclass
class ReplayResult:
    """Counts per (from pool, to pool) and total costs in integer micro-USD."""

    moves: Counter[tuple[str, str]] = field(default_factory=Counter)
    baseline_micro_usd: int = 0
    candidate_micro_usd: int = 0
    unscored: int = 0
    refused: int = 0

    @property
    def total(self) -> int:
        return sum(self.moves.values())

    @property
    def moved(self) -> int:
        return sum(n for (a, b), n in self.moves.items() if a != b)


def _route(loaded: LoadedPolicy, entry: LogEntry, threshold: float | None = None) -> tuple[str, bool]:
    """(pool or REFUSED, whether a needed score was missing) for one entry under `loaded` (`threshold`:
    the routing threshold to use instead of the policy's, see `policies.decide.decide`)."""
    ctx = RouteContext.from_request(entry.request, entry.tenant, entry.headers, entry.prompt_tokens)
    policy = loaded.policy
    if not known_model(policy, ctx.requested_model):
        return REFUSED, False
    try:
        decision = decide(policy, loaded.version, ctx, entry.score, threshold=threshold)
    except (PoolNotAllowed, ModelNotRouted):
        return REFUSED, False
    return decision.pool, entry.score is None and needs_score(policy, ctx)


def _cost(loaded: LoadedPolicy, pool: str, entry: LogEntry) -> int:
    spec = loaded.policy.pools.get(pool)
    return 0 if spec is None else spec.price.cost_micro_usd(entry.prompt_tokens, entry.completion_tokens)


def replay(entries: Iterable[LogEntry], candidate: LoadedPolicy, baseline: LoadedPolicy | None = None,
           thresholds: tuple[float | None, float | None] = (None, None)) -> ReplayResult:
    """Route each entry under `candidate` and compare with `baseline`'s routing, or with the pool recorded in
    the log when `baseline` is None (then priced with `candidate`'s prices). A pool a policy does not define,
    and a refused request, cost 0. `thresholds`: routing thresholds replacing (candidate's, baseline's)."""
    result = ReplayResult()
    for entry in entries:
        before = entry.pool if baseline is None else _route(baseline, entry, thresholds[1])[0]
        after, unscored = _route(candidate, entry, thresholds[0])
        result.moves[(before, after)] += 1
        result.unscored += unscored
        result.refused += after == REFUSED
        result.baseline_micro_usd += _cost(baseline or candidate, before, entry)
        result.candidate_micro_usd += _cost(candidate, after, entry)
    return result


def usd(micro: int) -> str:
    """Integer micro-USD shown as USD with 6 decimals, e.g. 1_500 -> '0.001500'."""
    return f"{Decimal(micro) / 1_000_000:.6f}"


def render_replay(result: ReplayResult, before_name: str, after_name: str) -> list[str]:
    """The from→to matrix (rows: `before_name`, columns: `after_name`) and the cost difference."""
    rows = sorted({a for a, _ in result.moves})
    cols = sorted({b for _, b in result.moves})
    width = max([len(c) for c in cols] + [len(r) for r in rows] + [8])
    lines = [f"{result.total} requests; {result.moved} move pools (rows: {before_name}, columns: {after_name})"]
    lines.append(" " * width + "".join(f" {c:>{width}}" for c in cols))
    for r in rows:
        lines.append(f"{r:<{width}}" + "".join(f" {result.moves.get((r, c), 0):>{width}}" for c in cols))
    diff = result.candidate_micro_usd - result.baseline_micro_usd
    lines.append(f"cost {before_name}: {usd(result.baseline_micro_usd)} USD; {after_name}: "
                 f"{usd(result.candidate_micro_usd)} USD; difference: {'+' if diff >= 0 else '-'}{usd(abs(diff))} USD")
    if result.unscored:
        lines.append(f"{result.unscored} requests needed a score the log does not have (decided without one)")
    if result.refused:
        lines.append(f"{result.refused} requests would be refused (unknown model or pool not allowed)")
    return lines
