"""Replicas that follow load: a local pool's `autoscale:` block, as ops write it.

The gateway that runs the pool's engines adds a replica while the pool is under pressure, and drains and stops
one after it has been idle (`gateway.control.fleet.autoscale`). Pressure is read from the same signals as the
degradation ladder's (`policies.ladder_schema`), with the same meaning and units, so that a policy can say that
growing comes before shedding: each bound must be below the `enter_above` of every ladder step that watches the
same signal on the same pool (`policies.checks`).
"""

from __future__ import annotations

from pydantic import Field, model_validator

from policies.frozen import Frozen

__all__ = ["Autoscale", "ScaleUp"]


class ScaleUp(Frozen):
    """Add a replica when any of these signals stays above its bound for `sustained_s` seconds."""

    kv_cache_usage: float | None = Field(default=None, gt=0, le=1, description="KV cache in use, 0..1 (highest "
                                         "replica)")
    queue_depth: float | None = Field(default=None, gt=0, description="requests waiting in the pool's engines "
                                      "(summed over replicas)")
    ttft_p95_s: float | None = Field(default=None, gt=0, description="p95 time to first token, seconds")
    in_flight: float | None = Field(default=None, gt=0, description="requests the gateway has open to the pool")
    sustained_s: float = Field(default=20.0, gt=0, description="how long the pressure must last")

    @model_validator(mode="after")
    def _has_a_bound(self) -> ScaleUp:
        if not self.bounds():
            raise ValueError("scale_up needs at least one of kv_cache_usage, queue_depth, ttft_p95_s, in_flight")
        return self

    def bounds(self) -> dict[str, float]:
        """The signals this block watches and their bounds."""
        signals = ("kv_cache_usage", "queue_depth", "ttft_p95_s", "in_flight")
        return {s: v for s in signals if (v := getattr(self, s)) is not None}


class Autoscale(Frozen):
    """Between `min_replicas` and `max_replicas` replicas: one more under sustained pressure (where the machine
    has room), one fewer after `scale_down_after_idle_s` without a request; at most one change per `cooldown_s`."""

    min_replicas: int = Field(default=1, ge=1, le=64)
    max_replicas: int = Field(ge=1, le=64)
    scale_up: ScaleUp
    scale_down_after_idle_s: float = Field(default=120.0, gt=0, description="idle this long: one replica fewer")
    cooldown_s: float = Field(default=30.0, ge=0, description="after a change, wait this long before the next")

    @model_validator(mode="after")
    def _bounds_in_order(self) -> Autoscale:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas {self.min_replicas} > max_replicas {self.max_replicas}; swap them")
        return self
