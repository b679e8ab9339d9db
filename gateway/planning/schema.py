"""The traffic forecast `cascade plan` reads (see deploy/forecast.yaml): frozen models, unknown keys rejected.

Per-replica capacity lives here, not in the policy: a pool's `capacity` is what one replica sustains while
meeting the ITL SLO (measure it with `python -m loadtest.bench.saturation`, or declare it). A pool without a
`capacity` falls back to its policy price's `prefill_tokens_per_second` and `decode_tokens_per_second` (or
the older single `tokens_per_second`, prompt and output tokens alike).
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import Field, ValidationError, model_validator

from policies.frozen import Frozen
from policies.loader import dotted_path

__all__ = ["Capacity", "Forecast", "ForecastError", "Routing", "Slo", "TokenClass", "load_forecast"]


class ForecastError(Exception):
    """A forecast that cannot be planned; the message names the file and each bad key."""


class TokenClass(Frozen):
    """One kind of request in the mix: its share of requests and mean prompt / output tokens."""

    share: float = Field(gt=0, le=1)
    prompt_tokens: int = Field(ge=0)
    output_tokens: int = Field(ge=1)


class Capacity(Frozen):
    """One replica at its SLO-meeting batch: replica-seconds per request are
    ``request_overhead_s + prompt_tokens / prefill_tokens_per_s + output_tokens / decode_tokens_per_s``."""

    prefill_tokens_per_s: float = Field(gt=0, description="prompt tokens/s one replica processes at full load")
    decode_tokens_per_s: float = Field(gt=0, description="output tokens/s of one replica with ITL within the SLO")
    request_overhead_s: float = Field(default=0.0, ge=0, description="fixed replica time per request")
    ttft_p95_idle_s: float | None = Field(
        default=None, gt=0, description="p95 time to first token as load goes to zero (the TTFT scale of the "
        "queueing model; `loadtest.bench.saturation` measures it). Default: ln(20) x the mean prefill work")


class Slo(Frozen):
    ttft_s: float = Field(gt=0, description="time to first token the plan must keep (p95 target)")
    itl_s: float = Field(gt=0, description="inter-token latency; `capacity` must have been measured within it")


class Routing(Frozen):
    """Where requests go: `shares` given per pool, or a `sample` of prompts (one JSON object a line with
    `prompt` or OpenAI `messages`, or plain text lines) scored by the shipped classifier and routed by the
    policy."""

    shares: dict[str, float] | None = None
    sample: str | None = Field(default=None, description="prompt file, relative to the forecast file")

    @model_validator(mode="after")
    def _one_source(self) -> Routing:
        if (self.shares is None) == (self.sample is None):
            raise ValueError("give exactly one of `shares` (per pool) or `sample` (a prompt file)")
        if self.shares is not None and abs(sum(self.shares.values()) - 1) > 1e-6:
            raise ValueError(f"shares must add up to 1, they add up to {sum(self.shares.values()):g}")
        return self


class Forecast(Frozen):
    version: int = 1
    hourly_requests_per_s: tuple[float, ...] = Field(min_length=1, max_length=24,
                                                     description="mean requests/s for each hour of the day (UTC)")
    token_mix: tuple[TokenClass, ...] = Field(min_length=1)
    routing: Routing
    slo: Slo
    utilization_ceiling: float = Field(default=0.8, gt=0, le=1, description="plan replicas to stay below this")
    capacity: dict[str, Capacity] = Field(default_factory=dict, description="per-replica capacity by pool")
    baseline_pool: str | None = Field(default=None, description="the all-flagship comparison (default: the "
                                      "policy's routing.flagship_pool)")

    @model_validator(mode="after")
    def _mix_adds_up(self) -> Forecast:
        total = sum(c.share for c in self.token_mix)
        if abs(total - 1) > 1e-6:
            raise ValueError(f"token_mix shares must add up to 1, they add up to {total:g}")
        if any(r < 0 for r in self.hourly_requests_per_s):
            raise ValueError("hourly_requests_per_s must be >= 0")
        return self


def load_forecast(path: Path) -> Forecast:
    """Parse a forecast file. Raises ForecastError naming the file and each bad key."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ForecastError(f"{path}: cannot read the forecast: {exc}") from exc
    try:
        return Forecast.model_validate(raw)
    except ValidationError as exc:
        lines = [f"{path}: {dotted_path(e['loc']) or '(top level)'}: {e['msg']}" for e in exc.errors()]
        raise ForecastError("invalid forecast:\n  " + "\n  ".join(lines)) from exc
