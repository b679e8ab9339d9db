"""The Batch API's lane and prices, as ops write them under the policy's `batches:` (every key has a default).

A batch line is routed like an interactive request, then sent only while the pool it was routed to has headroom: its
engines' queue (`max_queue` waiting requests, summed over replicas) and KV cache (`max_kv`, the fullest replica's
share) at or below the bounds, this gateway's interactive requests on it at most `max_interactive` (None: not
bounded), and at most `lines_in_flight` batch lines of this process on it. A line that waits `max_wait_s` without
headroom is put back on the queue (`gateway.batches`). With `preempt`, an interactive request routed to a pool that
finds it past those bounds (itself counted) cancels the lines running on it, each put back on the queue. Batch lines
are priced at the pool's price less its discount (`discount`, or the pool's own in `pool_discounts`), a fraction in
[0, 1] as providers give 0.5.

Without `preempt` the lane does not stop a line already running on an engine. Where the engine schedules by priority
(vLLM's `--scheduling-policy priority`, which the gateway knows only of a local pool's engines it starts:
`priority_scheduled`), a batch line's body carries `engine_priority` and an interactive request's none (the engine's
0): the engine then takes a waiting interactive request before any waiting line, and preempts lines first when its
KV cache runs short (`gateway.serving.openai.upstream.engine_body`).
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

from pydantic import Field

from policies.frozen import Frozen
from policies.pools import EngineSpec, LocalPool, RemotePool, engine_version, flag_value

__all__ = ["PRIORITY_SCHEDULING", "Batches", "discounted", "priority_engines", "priority_scheduled"]

PRIORITY_SCHEDULING = ("--scheduling-policy", "priority")
"""The engine arguments (a local pool's `engine.extra_args`) that make vLLM schedule by each request's `priority`."""


class Batches(Frozen):
    folder: str | None = Field(default=None, description="where batch files live on disk (default: "
                               "<CASCADE_HOME>/batches); every gateway sharing a Redis prefix must see the same one")
    max_queue: int = Field(default=0, ge=0, description="send a line only while the pool's engines have at most "
                           "this many requests waiting")
    max_kv: float = Field(default=0.9, ge=0, le=1, description="... and their fullest KV cache is at most this")
    max_interactive: int | None = Field(default=None, ge=0, description="... and this gateway has at most this many "
                                        "interactive requests in flight on the pool (None: not bounded)")
    preempt: bool = Field(default=False, description="cancel the lines running on a pool when an interactive "
                          "request routed to it finds the pool past these bounds (itself counted), and put them "
                          "back on the queue to run again from the start (off: a running line runs to its end)")
    lines_in_flight: int = Field(default=4, ge=1, le=256, description="batch lines one gateway process sends at once")
    max_wait_s: float = Field(default=5.0, gt=0, description="a line waits this long for headroom, then goes back "
                              "on the queue")
    claim_after_s: float = Field(default=300.0, ge=1, description="a line a worker took and did not answer in this "
                                 "long is taken by another worker (XAUTOCLAIM)")
    discount: float = Field(default=0.5, ge=0, le=1, description="share of the pool's price a batch line is spared")
    pool_discounts: dict[str, float] = Field(default_factory=dict, description="a pool's own discount")
    max_file_bytes: int = Field(default=200 * 1024 * 1024, ge=1, description="largest batch input file")
    file_ttl_days: int = Field(default=30, ge=1, description="days a file (an upload, a batch's output or error "
                               "file) is kept after it was created; an upload's `expires_after` may shorten it")
    max_lines: int = Field(default=50_000, ge=1, description="most lines in one batch")
    max_open_batches: int = Field(default=100, ge=1, description="most unfinished batches per tenant")
    max_open_lines: int = Field(default=1_000_000, ge=1, description="most lines in a tenant's unfinished batches")
    wake_on_demand: bool = Field(default=False, description="whether a batch line may wake a pool scaled to zero")
    engine_priority: int | None = Field(default=None, ge=1, description="the vLLM `priority` a batch line carries "
                                        "to an engine that schedules by priority (a local pool's engine with "
                                        "--scheduling-policy priority); interactive requests carry 0, which it "
                                        "serves first (None: none sent)")

    def discount_for(self, pool: str) -> float:
        return self.pool_discounts.get(pool, self.discount)


def discounted(micro_usd: int, discount: float) -> int:
    """`micro_usd` less `discount` of it, rounded half up to whole micro-USD (money stays integer)."""
    kept = Decimal(micro_usd) * (Decimal(1) - Decimal(str(discount)))
    return int(kept.quantize(Decimal(1), rounding=ROUND_HALF_UP))


def priority_scheduled(spec: LocalPool | RemotePool | None, version: str) -> bool:
    """Whether engine version `version` (`policies.pools.engine_version`) of the pool `spec` schedules by priority:
    it is the pool's own or canary engine, local, and started with `PRIORITY_SCHEDULING`. A remote pool's engines
    never are, as far as the gateway knows: a nonzero `priority` is an error on an engine that does not (400)."""
    return any(engine_version(e) == version for e in priority_engines(spec))  # hashed only where one is


def priority_engines(spec: LocalPool | RemotePool | None) -> tuple[EngineSpec, ...]:
    """The engines of the pool `spec` (its own and its canary's) started with `PRIORITY_SCHEDULING`: a local
    pool's only."""
    if not isinstance(spec, LocalPool):
        return ()
    engines = (spec.engine,) if spec.canary is None else (spec.engine, spec.canary.engine)
    return tuple(e for e in engines if flag_value(e.extra_args, PRIORITY_SCHEDULING[0]) == PRIORITY_SCHEDULING[1])
