"""Replay recorded traffic against a policy: which requests would move between pools, at what cost.

The log is JSON Lines, one request per line, exactly as the gateway writes it when request logging is on::

    {"request": {...chat-completions body...}, "tenant": "acme", "score": 0.42, "pool": "micro",
     "prompt_tokens": 812, "completion_tokens": 95}

- `request`: the client's body as received (model, messages, tools, response_format, metadata, ...);
- `tenant`: the authenticated tenant; `pool`: where the gateway sent it;
- `score`: the classifier's score, or null when none was computed (pinned model, pool rule);
- `prompt_tokens`, `completion_tokens`: the usage recorded for the request (integers >= 0);
- optional `headers`: {name: value} of request headers, for rules that match on headers;
- optional `tiers`: with routing.tiers, every tier's prediction as the cost record's `tiers` field and the
  `x-cascade-tiers` header show it ("general=0.670/$0.000120, ..."; `policies.tiers.parse_estimates`).

Replaying assumes the same usage wherever a request goes (the completion length of another model is
unknown) and re-uses the recorded score; a request that now needs a score but has none is decided
without one (and counted as `unscored`). Under a policy with `routing.tiers`, a request whose line carries a
prediction for every one of its tiers is decided by the trade, as the gateway decides it (`policies.decide`,
`policies.tiers.choose`): the recorded qualities, each tier priced at the replayed policy's prices for the recorded
prompt tokens and the tier's expected completion tokens, at the policy's `tradeoff` or, with `cost_per_1k`, the
tradeoff that holds that target over the replayed log's predictions (`policies.tiers.solve_tradeoff`; the gateway
holds it live over its recent traffic). Such requests are counted as `traded`; the others split by score between
the first and last tier.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from policies.context import RouteContext
from policies.decide import EmbeddingModel, ModelNotRouted, PoolNotAllowed, decide, known_model, needs_score
from policies.loader import LoadedPolicy
from policies.tiers import TierEstimate, Trade, expected_completion, expected_cost_usd, parse_estimates, solve_tradeoff

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
    tiers: tuple[TierEstimate, ...] = ()


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
    tiers = obj.get("tiers") or ""
    if not isinstance(tiers, str):
        raise ValueError("`tiers` must be a string (as the cost record's `tiers` field)")
    return LogEntry(obj["request"], str(obj.get("tenant") or "default"), None if score is None else float(score),
                    str(obj.get("pool") or ""), obj["prompt_tokens"], obj["completion_tokens"],
                    {str(k): str(v) for k, v in headers.items()}, parse_estimates(tiers))


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
    traded: int = 0  # decided by the trade on the line's recorded tier predictions
    tradeoff: float | None = None  # the candidate's tradeoff in force (None: no request traded)

    @property
    def total(self) -> int:
        return sum(self.moves.values())

    @property
    def moved(self) -> int:
        return sum(n for (a, b), n in self.moves.items() if a != b)


def _estimates(loaded: LoadedPolicy, entry: LogEntry) -> tuple[TierEstimate, ...] | None:
    """The entry's recorded prediction of every tier of `loaded` (in tier order), priced at its prices (module
    docstring); None without `routing.tiers` or when the line misses one of them."""
    policy = loaded.policy
    recorded = {e.pool: e.quality for e in entry.tiers}
    tiers = policy.routing.tiers or ()
    if not tiers or not all(p in recorded for p in tiers):
        return None
    return tuple(TierEstimate(p, recorded[p], expected_cost_usd(policy.pools[p].price, entry.prompt_tokens,
                                                                expected_completion(policy, p))) for p in tiers)


def _tradeoff(loaded: LoadedPolicy, rows: list[tuple[TierEstimate, ...]]) -> float:
    """The tradeoff a tiers policy replays at: its own, else the one holding `cost_per_1k` over `rows`, else 0."""
    routing = loaded.policy.routing
    if routing.tradeoff is not None or routing.cost_per_1k is None or not rows:
        return routing.tradeoff or 0.0
    return solve_tradeoff(rows, routing.cost_per_1k / 1e6)


def _trades(loaded: LoadedPolicy, entries: list[LogEntry]) -> tuple[list[Trade | None], float | None]:
    """Each entry's trade under `loaded` (None: it splits by score) and the tradeoff in force (None: no trade)."""
    estimates = [_estimates(loaded, e) for e in entries]
    rows = [row for row in estimates if row is not None]
    if not rows:
        return [None] * len(entries), None
    tradeoff = _tradeoff(loaded, rows)
    return [None if row is None else Trade(row, tradeoff) for row in estimates], tradeoff


def _route(loaded: LoadedPolicy, entry: LogEntry, threshold: float | None = None,
           trade: Trade | None = None) -> tuple[str, bool]:
    """(pool or REFUSED, whether a needed score was missing) for one entry under `loaded` (`threshold`:
    the routing threshold to use instead of the policy's; `trade`: its tiers' predictions; see
    `policies.decide.decide`)."""
    ctx = RouteContext.from_request(entry.request, entry.tenant, entry.headers, entry.prompt_tokens)
    policy = loaded.policy
    if not known_model(policy, ctx.requested_model):
        return REFUSED, False
    try:
        decision = decide(policy, loaded.version, ctx, entry.score, threshold=threshold, trade=trade)
    except (PoolNotAllowed, ModelNotRouted, EmbeddingModel):
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
    entries = list(entries)
    trades, result.tradeoff = _trades(candidate, entries)
    baseline_trades = _trades(baseline, entries)[0] if baseline is not None else [None] * len(entries)
    for entry, trade, baseline_trade in zip(entries, trades, baseline_trades, strict=True):
        before = entry.pool if baseline is None else _route(baseline, entry, thresholds[1], baseline_trade)[0]
        after, unscored = _route(candidate, entry, thresholds[0], trade)
        result.moves[(before, after)] += 1
        result.traded += trade is not None
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
    if result.traded:
        lines.append(f"{result.traded} requests decided by the trade on their recorded tier predictions (tradeoff "
                     f"{result.tradeoff:g}: quality one USD of expected cost per request is worth)")
    if result.unscored:
        lines.append(f"{result.unscored} requests needed a score the log does not have (decided without one)")
    if result.refused:
        lines.append(f"{result.refused} requests would be refused (unknown model or pool not allowed)")
    return lines
