"""The cost record: one finished request's usage and cost, its validation and its flat string codec.

Pure (no I/O). Money is integer micro-USD; times are UTC epoch seconds. `gateway.ledger.store` re-exports all
of it; import from there.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ENDPOINT_COUNTERS",
    "ENDPOINT_FIELDS",
    "IN_DOMAIN_COUNTERS",
    "MAX_MICRO_USD",
    "MAX_ROUTE",
    "MAX_TOKENS",
    "ROLLUP_FIELDS",
    "SPLIT_ENDPOINTS",
    "TIER_COUNTERS",
    "CostRecord",
    "InvalidCostRecord",
    "cache_counters",
    "endpoint_counters",
    "extra_counters",
    "in_domain_counters",
    "overflow_scored",
    "record_from_fields",
    "record_to_fields",
    "tier_counters",
    "validate_record",
]

MAX_TOKENS = 10**9  # per request
MAX_MICRO_USD = 10**12  # per request: one million USD
_EPOCH_MIN = 946_684_800.0  # 2000-01-01T00:00:00Z
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/@+\-]{0,127}")  # no ":" (key separator), no "{}" (hash tags)
_REQUEST_ID = re.compile(r"[\x21-\x7e]{1,128}")
_TEXT = re.compile(r"[^\x00-\x1f\x7f]{0,256}")
MAX_ROUTE = 2048  # characters of a record's `route`: its writer cuts a longer one (`Accountant.cost_record`)
_ROUTE = re.compile(rf"[^\x00-\x1f\x7f]{{0,{MAX_ROUTE}}}")
_STATUSES = frozenset({"ok", "client_disconnect", "upstream_error", "escalated", "shadow", "discarded",
                       "cache_hit"})
_USAGE_SOURCES = frozenset({"engine", "tokenizer", "estimate"})
_ENDPOINTS = frozenset({"chat", "responses", "completions", "embeddings"})
_BATCH_ID = re.compile(r"|batch_[A-Za-z0-9]{1,64}")
_INT_FIELDS = ("prompt_tokens", "completion_tokens", "cost_micro_usd", "flagship_cost_micro_usd")
# the counters each record adds to its rollups beside `requests` and the `_INT_FIELDS` (`extra_counters`):
# `overflow_scored`: requests the router's overflow model scored; `output_checked` / `output_check_failed`:
# answers the output checks judged, and those that failed one (`gateway.checking`); `cache_hits` /
# `cache_misses` / `cache_avoided_micro_usd`: answers served from the response cache, answers it was asked for and
# did not have, and what the hits would have cost on their pool (`gateway.caching`)
# `<endpoint>_<field>`: the requests, tokens and cost of the non-chat endpoints (chat's are the rest of the
# rollup), so that the cost report can split by endpoint (`endpoint_counters`)
# "batch": the lines of batches (`gateway.batches`), whatever endpoint each asked: their own rows, not their endpoint's
SPLIT_ENDPOINTS = ("responses", "completions", "embeddings", "batch")
ENDPOINT_FIELDS = ("requests", "prompt_tokens", "completion_tokens", "cost_micro_usd", "flagship_cost_micro_usd")
ENDPOINT_COUNTERS = tuple(f"{endpoint}_{name}" for endpoint in SPLIT_ENDPOINTS for name in ENDPOINT_FIELDS)
# `in_domain_scored`: requests with an in-domain figure (`router_models.serving.domain`); `in_domain_t<k>`: those
# whose figure lies in [k/10, (k+1)/10) (t9 includes 1.0), so a report tells the share below any bound in tenths
IN_DOMAIN_COUNTERS = ("in_domain_scored", *(f"in_domain_t{k}" for k in range(10)))
# `tier_predicted`: answered requests with every tier's prediction (routing.tiers: `tiers`); `tier_quality_milli` /
# `top_quality_milli`: the predicted quality (in thousandths) of the pool that answered and of the most capable
# (last) tier, on the same map, so that a report tells the quality kept (`tier_counters`)
TIER_COUNTERS = ("tier_predicted", "tier_quality_milli", "top_quality_milli")
EXTRA_COUNTERS = ("overflow_scored", "output_checked", "output_check_failed", "cache_hits", "cache_misses",
                  "cache_avoided_micro_usd", *ENDPOINT_COUNTERS, *IN_DOMAIN_COUNTERS, *TIER_COUNTERS)
ROLLUP_FIELDS = ("requests", *_INT_FIELDS, *EXTRA_COUNTERS)
_STR_FIELDS = ("request_id", "tenant", "pool", "model", "rule", "policy_version", "status", "usage_source")
# added after the first release: "" when an older record lacks them
_LATER_STR_FIELDS = ("scored_by", "router_version", "pool_version", "output_check", "cache", "endpoint", "route",
                     "key_id", "tiers", "completion_limit_by", "batch_id", "custom_id")
_KEY_ID = re.compile(r"[0-9a-f]{1,64}")
_LATER_INT_FIELDS = ("cache_avoided_micro_usd", "completion_limit_tokens")  # "0" when an older record lacks them
_CACHE_RESULTS = frozenset({"", "hit", "miss", "bypass"})
_LIMITS_BY = frozenset({"", "default", "context", "engine"})
_ANSWERS = frozenset({"ok", "client_disconnect", "upstream_error"})  # the statuses of a request's final record
_OUTPUT_CHECK = re.compile(r"|pass|fail:[a-z_]+(,[a-z_]+)*")


@dataclass(frozen=True, slots=True)
class CostRecord:
    """What one finished request used and cost. Money is integer micro-USD; times are UTC epoch seconds.

    `status` is "ok" (answer complete), "escalated" (a cascade probe replaced by the flagship),
    "client_disconnect" (charged for what was generated),
    "upstream_error" (charged for what the engine reported before failing) or
    "shadow" (a shadow comparison's flagship or judge call, `gateway.learning.shadow`: tenant "cascade.shadow").
    "discarded" (an answer that failed an output check and was retried or escalated: `gateway.checking`),
    "cache_hit" (answered from the response cache, `gateway.caching`: cost 0, `cache_avoided_micro_usd` what the
    pool would have charged for the answer's tokens, the flagship counterfactual as for any answer).
    """

    request_id: str
    tenant: str
    pool: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    cost_micro_usd: int
    flagship_cost_micro_usd: int  # the same tokens at the flagship's prices (0 for an escalated probe, a shadow call)
    rule: str
    policy_version: str
    started_at: float
    ttft_ms: float | None
    latency_ms: float
    status: str = "ok"
    usage_source: str = "engine"  # "engine" (usage chunk), "tokenizer" (a local engine's /tokenize or a remote
    # pool's tokenizer on the gateway's machine), "estimate" (4 characters a token)
    scored_by: str = ""  # the router model that scored it ("primary", "overflow", ...); "" when not scored
    router_version: str = ""  # the router artifact that scored it (`x-cascade-router-version`); "" when not scored
    pool_version: str = ""  # the engine version that answered (`x-cascade-pool-version`: the pool's or its canary's)
    output_check: str = ""  # "" (no output check ran), "pass", or "fail:<check>,..." (`gateway.checking`)
    cache: str = ""  # the response cache's answer: "" (no cache for the tenant), "hit", "miss" or "bypass"
    cache_avoided_micro_usd: int = 0  # a hit's cost on its pool had the engine answered (0 for any other record)
    endpoint: str = "chat"  # the OpenAI endpoint asked: "chat", "responses", "completions" or "embeddings" (a
    # record written before the field existed reads as "chat", the only endpoint then)
    route: str = ""  # the steps that chose its pool, as `x-cascade-route` shows them (`policies.decide.route_text`):
    # "score:micro, context-fit:flagship"; "" in a record written before the field existed
    key_id: str = ""  # the caller's API key id (`gateway.tenancy.api_keys`: 12 hex digits); "" when none
    tiers: str = ""  # with routing.tiers: every tier's predicted quality and expected cost as `x-cascade-tiers`
    # shows them (`policies.tiers.estimates_text`): "general=0.670/$0.000120, ..."; "" without a prediction
    in_domain: float | None = None  # how close the request is to the router's training data, in [0, 1]
    # (`router_models.serving.domain`); None when not scored, scored by the overflow model, by an artifact without
    # a domain reference, or in a record written before the field existed
    completion_limit_tokens: int = 0  # the completion limit (tokens per choice) the gateway sent for a request
    # that set none (`gateway.serving.routing.completion_limit`); 0 when the client's own limit applied or none was set
    completion_limit_by: str = ""  # why that limit: "default" (the policy's `default_max_tokens`), "context" (the
    # pool's context left after the prompt), "engine" (nothing sent: a local engine stops at the context left by
    # itself), "" (none set)
    batch_id: str = ""  # the batch the request was a line of (`gateway.batches`); "" for an interactive request
    custom_id: str = ""  # that line's `custom_id` (the client's own name for it); "" for an interactive request


def overflow_scored(rec: CostRecord) -> int:
    """1 when the router's overflow model scored `rec` (`router_models.serving.classifier_scorer`), else 0: its
    rollup counter."""
    return int(rec.scored_by == "overflow")


def extra_counters(rec: CostRecord) -> tuple[int, ...]:
    """What `rec` adds to each of the `EXTRA_COUNTERS` of its rollups, in that order."""
    return (overflow_scored(rec), int(rec.output_check != ""), int(rec.output_check.startswith("fail")),
            *cache_counters(rec), *endpoint_counters(rec), *in_domain_counters(rec), *tier_counters(rec))


def tier_counters(rec: CostRecord) -> tuple[int, int, int]:
    """What `rec` adds to the `TIER_COUNTERS`: 1, its pool's predicted quality and the last tier's, in thousandths;
    nothing without a prediction for its pool, nor for a record another record of the request follows."""
    if not rec.tiers or rec.status not in _ANSWERS:
        return 0, 0, 0
    quality: dict[str, int] = {}  # in tier order: the last is the most capable tier
    for item in rec.tiers.split(", "):
        pool, _, rest = item.partition("=")
        try:
            quality[pool] = round(float(rest.partition("/")[0]) * 1000)
        except ValueError:
            return 0, 0, 0
    if rec.pool not in quality:
        return 0, 0, 0
    return 1, quality[rec.pool], list(quality.values())[-1]


def in_domain_counters(rec: CostRecord) -> tuple[int, ...]:
    """What `rec` adds to the `IN_DOMAIN_COUNTERS`: 1 to `in_domain_scored` and to its figure's tenth; nothing
    without a figure, nor for a record that another record of the request follows (a cascade probe, a discarded
    answer): a request counts once."""
    if rec.in_domain is None or rec.status not in (*_ANSWERS, "cache_hit"):
        return (0,) * len(IN_DOMAIN_COUNTERS)
    tenth = min(9, int(rec.in_domain * 10))
    return (1, *(int(k == tenth) for k in range(10)))


def endpoint_counters(rec: CostRecord) -> tuple[int, ...]:
    """What `rec` adds to the `ENDPOINT_COUNTERS`: its request, tokens and costs under its own endpoint's names
    (nothing for a chat record), or under "batch" for a batch line's, whatever its endpoint."""
    values = (1, rec.prompt_tokens, rec.completion_tokens, rec.cost_micro_usd, rec.flagship_cost_micro_usd)
    split = "batch" if rec.batch_id else rec.endpoint
    return tuple(v if split == endpoint else 0 for endpoint in SPLIT_ENDPOINTS for v in values)


def cache_counters(rec: CostRecord) -> tuple[int, int, int]:
    """(hits, misses, avoided micro-USD) `rec` adds to the cache's rollup counters. A miss counts once per request:
    on its final record, not on a cascade probe or a discarded answer that another record of it follows."""
    answered = rec.status in _ANSWERS
    return int(rec.status == "cache_hit"), int(rec.cache == "miss" and answered), rec.cache_avoided_micro_usd


class InvalidCostRecord(ValueError):
    """A record (from the gateway, the outbox or the stream) that the ledger refuses to count."""


# the string fields and the pattern each must match, in the order they are checked
_PATTERNS = (
    ("tenant", _NAME), ("pool", _NAME), ("model", _NAME), ("request_id", _REQUEST_ID), ("rule", _TEXT),
    ("route", _ROUTE), ("tiers", _ROUTE), ("policy_version", _TEXT), ("scored_by", _NAME), ("router_version", _NAME),
    ("pool_version", _NAME), ("output_check", _OUTPUT_CHECK), ("batch_id", _BATCH_ID), ("custom_id", _TEXT),
    ("key_id", _KEY_ID),
)
_MAY_BE_EMPTY = frozenset({"scored_by", "router_version", "pool_version", "key_id"})  # "": not scored, no key
_CHOICES = (("endpoint", _ENDPOINTS), ("cache", _CACHE_RESULTS), ("completion_limit_by", _LIMITS_BY))


def validate_record(rec: CostRecord, *, now: float | None = None) -> None:
    """Raise `InvalidCostRecord` naming the first bad field. `now` (UTC epoch s) bounds `started_at`."""
    for name, pattern in _PATTERNS:
        value = getattr(rec, name)
        if value or name not in _MAY_BE_EMPTY:
            _check(name, value, pattern)
    for name, allowed in _CHOICES:
        _check_choice(name, getattr(rec, name), allowed)
    for name in _INT_FIELDS + _LATER_INT_FIELDS:
        value = getattr(rec, name)
        limit = MAX_TOKENS if name.endswith("tokens") else MAX_MICRO_USD
        if type(value) is not int or not 0 <= value <= limit:
            raise InvalidCostRecord(f"{name}: must be an integer in [0, {limit}], got {value!r}")
    latest = (time.time() if now is None else now) + 86_400.0
    _check_float("started_at", rec.started_at, _EPOCH_MIN, latest)
    _check_float("latency_ms", rec.latency_ms, 0.0, math.inf)
    if rec.ttft_ms is not None:
        _check_float("ttft_ms", rec.ttft_ms, 0.0, math.inf)
    if rec.in_domain is not None:
        _check_float("in_domain", rec.in_domain, 0.0, 1.0)
    _check_choice("status", rec.status, _STATUSES)
    if rec.usage_source not in _USAGE_SOURCES:
        raise InvalidCostRecord(f"usage_source: must be one of {sorted(_USAGE_SOURCES)}")


def _check(name: str, value: object, pattern: re.Pattern[str]) -> None:
    if not isinstance(value, str) or pattern.fullmatch(value) is None:
        raise InvalidCostRecord(f"{name}: {value!r} does not match {pattern.pattern}")


def _check_choice(name: str, value: object, allowed: frozenset[str]) -> None:
    if value not in allowed:
        raise InvalidCostRecord(f"{name}: must be one of {sorted(allowed)}, got {value!r}")


def _check_float(name: str, value: object, low: float, high: float) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not low <= float(value) <= high:  # type: ignore[arg-type]
        raise InvalidCostRecord(f"{name}: must be a finite number in [{low}, {high}], got {value!r}")


def record_to_fields(rec: CostRecord) -> dict[str, str]:
    """Flat string form used in the stream entry and the outbox line (floats as `repr`, None as "")."""
    names = _STR_FIELDS + _LATER_STR_FIELDS + _INT_FIELDS + _LATER_INT_FIELDS
    fields = {name: str(getattr(rec, name)) for name in names}
    fields["started_at"] = repr(float(rec.started_at))
    fields["ttft_ms"] = "" if rec.ttft_ms is None else repr(float(rec.ttft_ms))
    fields["latency_ms"] = repr(float(rec.latency_ms))
    fields["in_domain"] = "" if rec.in_domain is None else repr(float(rec.in_domain))
    return fields


def record_from_fields(fields: Mapping[str, str]) -> CostRecord:
    """Inverse of `record_to_fields`, validated. Raises `InvalidCostRecord` on any malformed field."""
    try:
        values: dict[str, Any] = {name: fields[name] for name in _STR_FIELDS}
        values.update({name: fields.get(name, "") for name in _LATER_STR_FIELDS})
        values["endpoint"] = values["endpoint"] or "chat"
        later = {name: fields.get(name, "0") for name in _LATER_INT_FIELDS}
        for name, text in [*((n, fields[n]) for n in _INT_FIELDS), *later.items()]:
            if not (text.isascii() and text.isdigit()):
                raise ValueError(f"{name} is not a decimal integer")
            values[name] = int(text)
        values["started_at"] = float(fields["started_at"])
        values["ttft_ms"] = float(fields["ttft_ms"]) if fields["ttft_ms"] else None
        values["latency_ms"] = float(fields["latency_ms"])
        values["in_domain"] = float(fields["in_domain"]) if fields.get("in_domain") else None
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise InvalidCostRecord(f"malformed record fields: {exc}") from exc
    rec = CostRecord(**values)
    validate_record(rec, now=math.inf)
    return rec
