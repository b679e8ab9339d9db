"""The counters of a cost rollup and how a report shows money and shares.

`Counters` is one rollup hash of the ledger (or a sum of them), every figure an integer (micro-USD, tokens,
requests); `usd`, `pct` and `display` format them for people. `gateway.costs.report` builds reports of them (and
re-exports these names).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.ledger.record import ENDPOINT_FIELDS, SPLIT_ENDPOINTS
from gateway.ledger.store import ROLLUP_FIELDS, CostRecord, extra_counters

__all__ = ["Counters", "display", "pct", "usd"]


def usd(micro: int) -> str:
    """Integer micro-USD as a USD decimal string with 6 decimals ("-1.000001"); no float involved."""
    sign = "-" if micro < 0 else ""
    whole, frac = divmod(abs(micro), 1_000_000)
    return f"{sign}{whole}.{frac:06d}"


def pct(part: int, whole: int) -> str:
    """`part / whole` as a percentage with one decimal, rounded half away from zero; "-" if whole is 0."""
    if whole == 0:
        return "-"
    tenths = (abs(part) * 2000 + whole) // (2 * whole)
    sign = "-" if part < 0 and tenths else ""
    return f"{sign}{tenths // 10}.{tenths % 10}%"


def display(value: object) -> str:
    """A report cell for people (table, HTML): "-" for None, integers with thousands separators."""
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


@dataclass(frozen=True, slots=True)
class Counters:
    """The counters of one rollup (or a sum of rollups). Money in micro-USD."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_micro_usd: int = 0
    flagship_cost_micro_usd: int = 0
    overflow_scored: int = 0  # requests the router's overflow model scored (the quality estimate weighs them)
    output_checked: int = 0  # answers an output check judged (`gateway.checking`)
    output_check_failed: int = 0  # of those, answers that failed a check
    cache_hits: int = 0  # answered from the response cache (`gateway.caching`): cost 0
    cache_misses: int = 0  # asked of the cache, not found there, answered by an engine
    cache_avoided_micro_usd: int = 0  # what the hits would have cost on their pools
    # the Responses, completions and embeddings endpoints' share of the five counters above the extra ones (chat:
    # the rest)
    responses_requests: int = 0
    responses_prompt_tokens: int = 0
    responses_completion_tokens: int = 0
    responses_cost_micro_usd: int = 0
    responses_flagship_cost_micro_usd: int = 0
    completions_requests: int = 0
    completions_prompt_tokens: int = 0
    completions_completion_tokens: int = 0
    completions_cost_micro_usd: int = 0
    completions_flagship_cost_micro_usd: int = 0
    embeddings_requests: int = 0
    embeddings_prompt_tokens: int = 0
    embeddings_completion_tokens: int = 0
    embeddings_cost_micro_usd: int = 0
    embeddings_flagship_cost_micro_usd: int = 0
    # batch lines' share (`gateway.batches`), whatever endpoint they asked: not in their endpoint's split above
    batch_requests: int = 0
    batch_prompt_tokens: int = 0
    batch_completion_tokens: int = 0
    batch_cost_micro_usd: int = 0
    batch_flagship_cost_micro_usd: int = 0
    # requests with an in-domain figure, and how many of them fell in each tenth of [0, 1] (`IN_DOMAIN_COUNTERS`)
    in_domain_scored: int = 0
    in_domain_t0: int = 0
    in_domain_t1: int = 0
    in_domain_t2: int = 0
    in_domain_t3: int = 0
    in_domain_t4: int = 0
    in_domain_t5: int = 0
    in_domain_t6: int = 0
    in_domain_t7: int = 0
    in_domain_t8: int = 0
    in_domain_t9: int = 0
    # requests with every tier's prediction, and the predicted quality of their pools and of the most capable tier
    # in thousandths (`TIER_COUNTERS`): their ratio is the quality kept on the pool map
    tier_predicted: int = 0
    tier_quality_milli: int = 0
    top_quality_milli: int = 0

    def in_domain_below(self, bound: float) -> int:
        """Requests whose in-domain figure is below `bound` (a multiple of 0.1: the rollups count tenths)."""
        tenths = round(bound * 10)
        return sum(getattr(self, f"in_domain_t{k}") for k in range(min(10, max(0, tenths))))

    def of_endpoint(self, endpoint: str) -> Counters:
        """The requests, tokens and costs of one endpoint ("chat", "responses", "completions", "embeddings", or
        "batch": batch lines whatever their endpoint, which the others leave out); the other counters are not split by
        endpoint and are 0 here."""
        if endpoint in SPLIT_ENDPOINTS:
            return Counters(*(getattr(self, f"{endpoint}_{name}") for name in ENDPOINT_FIELDS))
        return Counters(*(getattr(self, name) - sum(getattr(self, f"{e}_{name}") for e in SPLIT_ENDPOINTS)
                          for name in ENDPOINT_FIELDS))

    @classmethod
    def of(cls, rec: CostRecord) -> Counters:
        """What one record adds to its rollups (the ledger's record script does the same in Redis)."""
        return cls(1, rec.prompt_tokens, rec.completion_tokens, rec.cost_micro_usd, rec.flagship_cost_micro_usd,
                   *extra_counters(rec))

    @classmethod
    def from_hash(cls, raw: Mapping[Any, Any]) -> Counters:
        """From an HGETALL reply (bytes or str keys); missing fields are 0."""
        text = {(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in raw.items()}
        return cls(**{name: text.get(name, 0) for name in ROLLUP_FIELDS})

    def __add__(self, other: Counters) -> Counters:
        return Counters(*(getattr(self, n) + getattr(other, n) for n in ROLLUP_FIELDS))

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def savings_micro_usd(self) -> int:
        """Counterfactual "everything on the flagship" minus actual cost (negative if routing cost more)."""
        return self.flagship_cost_micro_usd - self.cost_micro_usd

    @property
    def cache_lookups(self) -> int:
        """Requests the response cache was asked for (hits and misses; bypassed ones are not asked)."""
        return self.cache_hits + self.cache_misses

    @property
    def cost_per_1k_tokens_micro_usd(self) -> int | None:
        """Cost per 1000 tokens in micro-USD, rounded half up; None without tokens."""
        if self.total_tokens == 0:
            return None
        return (self.cost_micro_usd * 2000 + self.total_tokens) // (2 * self.total_tokens)
