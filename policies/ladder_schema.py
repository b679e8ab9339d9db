"""The degradation ladder as ops write it: ordered steps, each a signal on a pool with hysteresis, and
an action. The state machine that runs it is `policies.ladder`.

A step's `scope` says which requests its truncate_context, shed and force_stream act on: `pool` (the
default) only requests routed to the pool whose signal fired (a queue on the flagship does not shed micro
traffic), `all` every request. Pool moves (fallback_pool, overflow) and raise_threshold act on routing
itself and ignore `scope`.

A step enters when its signal goes above `enter_above`, and leaves when the signal is below `exit_below`
(< `enter_above`) and the step has been active for at least `hold_s` seconds. Signals:

- `kv_cache_usage`: fraction 0..1 of the pool's KV cache in use (vLLM `kv_cache_usage_perc`, highest replica);
- `queue_depth`: requests waiting in the pool (vLLM `num_requests_waiting`, summed over replicas);
- `ttft_p95_s`: 95th percentile time to first token in seconds, as the gateway measured it;
- `error_rate`: fraction 0..1 of the pool's recent requests that failed;
- `in_flight`: requests this gateway (every worker, with a shared ladder) has open to the pool right now.
  By Little's law it is arrival rate x latency, so it rises at once when the pool slows down for any
  reason (its own queue, or engines sharing a machine), where `queue_depth` sees only the engine's queue and
  `ttft_p95_s` only requests that already finished.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from policies.frozen import Frozen

__all__ = [
    "FRACTION_SIGNALS",
    "Action",
    "Degradation",
    "FallbackPool",
    "ForceStream",
    "LadderStep",
    "Overflow",
    "RaiseThreshold",
    "Scope",
    "Shed",
    "Signal",
    "TruncateContext",
]

Scope = Literal["pool", "all"]
"""Which requests a step's request-shaping action acts on: those routed to the step's `pool`, or all."""
Signal = Literal["kv_cache_usage", "queue_depth", "ttft_p95_s", "error_rate", "in_flight"]
FRACTION_SIGNALS = frozenset({"kv_cache_usage", "error_rate"})


class RaiseThreshold(Frozen):
    """Route `auto` requests by score with at least this threshold: borderline ones stay on the micro pool."""

    type: Literal["raise_threshold"]
    threshold: float = Field(ge=0, le=1)


class TruncateContext(Frozen):
    """Cut prompts to `max_tokens`, keeping system messages and the latest turns (`policies.truncate`)."""

    type: Literal["truncate_context"]
    max_tokens: int = Field(ge=1)


class FallbackPool(Frozen):
    """Send the traffic of `from_pool` (default: the watched pool) to `to_pool`, e.g. a quantized copy."""

    type: Literal["fallback_pool"]
    to_pool: str
    from_pool: str | None = Field(default=None, description="default: the pool the step watches")
    max_json_failure_rate: float | None = Field(
        default=None, gt=0, le=1, description="stop sending JSON requests (response_format json_object / "
        "json_schema) to `to_pool` while the share of its answers failing the json output check, over the last "
        "`json_window` checked answers, is above this (they stay on `from_pool`); needs a `json` output check")
    json_window: int = Field(default=50, ge=5, le=10_000, description="checked JSON answers the rate is taken over")


class Overflow(Frozen):
    """Send the traffic of `from_pool` (default: the watched pool) to a remote pool `to_pool`."""

    type: Literal["overflow"]
    to_pool: str
    from_pool: str | None = Field(default=None, description="default: the pool the step watches")


class ForceStream(Frozen):
    """Stream every answer (frees the client's connection slot sooner, first bytes earlier)."""

    type: Literal["force_stream"]


class Shed(Frozen):
    """Reject tenants whose priority is below `below_priority` with 429 and `Retry-After: retry_after_s`."""

    type: Literal["shed"]
    below_priority: int
    retry_after_s: int = Field(default=30, ge=1, le=3600)


Action = Annotated[
    RaiseThreshold | TruncateContext | FallbackPool | Overflow | ForceStream | Shed, Field(discriminator="type")
]


class LadderStep(Frozen):
    name: str = Field(min_length=1)
    signal: Signal
    pool: str = Field(description="the pool whose signal this step watches")
    enter_above: float = Field(ge=0, description="activate when the signal is above this")
    exit_below: float = Field(ge=0, description="deactivate when below this (must be < enter_above)")
    hold_s: float = Field(default=30, ge=0, description="stay active at least this long once entered")
    action: Action
    scope: Scope = Field(
        default="pool",
        description="which requests truncate_context, shed and force_stream act on: 'pool' (default) only "
        "requests routed to the watched `pool`, 'all' every request; fallback_pool, overflow and raise_threshold "
        "act on routing and ignore it",
    )

    @property
    def remap(self) -> tuple[str, str] | None:
        """(from pool, to pool) for fallback_pool / overflow actions, else None."""
        if isinstance(self.action, FallbackPool | Overflow):
            return (self.action.from_pool or self.pool, self.action.to_pool)
        return None


class Degradation(Frozen):
    """Ordered steps; every step whose signal crossed its threshold is active at once (they combine)."""

    steps: tuple[LadderStep, ...] = ()
