"""Prices: USD as ops write it, integer micro-USD inside. Floats never carry money.

A pool is priced in one of two forms:

- per token: ``{input_per_mtok: "0.20", output_per_mtok: "0.60"}`` (USD per million tokens);
- per GPU-hour: ``{gpu_hour_usd: "2.50", tokens_per_second: 2400}``, where ``gpu_hour_usd`` is what one
  replica's hardware costs per hour (all its GPUs) and ``tokens_per_second`` is that replica's measured
  throughput (prompt + completion tokens per second at representative load). Both per-token prices are
  then derived, and equal::

      micro-USD per Mtok = round_half_up(gpu_hour_usd * 10**6 * 10**6 / (tokens_per_second * 3600))

  e.g. 2.50 USD/h at 2400 tok/s → 289_352 micro-USD (0.289352 USD) per million tokens.
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Any

from pydantic import ConfigDict, Field, field_validator, model_validator

from policies.frozen import Frozen

__all__ = ["Price", "mtok_price_from_gpu_hour", "usd_to_micro"]


def usd_to_micro(value: Any) -> int:
    """Parse a USD amount (decimal string or number) into integer micro-USD.

    Raises ValueError for a non-number, a negative or infinite amount, or more precision than 1 micro-USD.
    """
    try:
        amount = Decimal(str(value))
    except InvalidOperation as exc:
        raise ValueError(f"not a price in USD: {value!r}") from exc
    if not amount.is_finite() or amount < 0:
        raise ValueError(f"a price must be a finite amount >= 0 USD, got {value!r}")
    micro = amount * 1_000_000
    if micro != micro.to_integral_value():
        raise ValueError(f"{value!r} USD has more precision than one micro-USD")
    return int(micro)


def mtok_price_from_gpu_hour(gpu_hour_micro_usd: int, tokens_per_second: Decimal) -> int:
    """Micro-USD per million tokens for hardware costing `gpu_hour_micro_usd` per hour at that throughput."""
    per_mtok = Decimal(gpu_hour_micro_usd) * 1_000_000 / (tokens_per_second * 3600)
    return int(per_mtok.quantize(Decimal(1), rounding=ROUND_HALF_UP))


def _document_both_forms(schema: dict[str, Any]) -> None:
    """JSON Schema as ops write it: USD as strings or numbers, and either of the two forms."""
    for name in ("input_per_mtok", "output_per_mtok", "gpu_hour_usd"):
        schema["properties"][name] = {**schema["properties"][name], "type": ["string", "number"]}
        schema["properties"][name].pop("anyOf", None)
    schema.pop("required", None)
    schema["oneOf"] = [{"required": ["input_per_mtok", "output_per_mtok"]},
                       {"required": ["gpu_hour_usd", "tokens_per_second"]}]


class Price(Frozen):
    """Integer micro-USD per million tokens. Give the two per-Mtok prices, or `gpu_hour_usd` with
    `tokens_per_second` (see the module docstring for the formula); never both forms."""

    model_config = ConfigDict(frozen=True, extra="forbid", json_schema_extra=_document_both_forms)

    input_per_mtok: int = Field(description="USD per 1M prompt tokens, e.g. 0.20")
    output_per_mtok: int = Field(description="USD per 1M completion tokens, e.g. 0.60")
    gpu_hour_usd: int | None = Field(default=None, description="USD per replica-hour, e.g. 2.50 (derived form)")
    tokens_per_second: float | None = Field(default=None, gt=0, description="measured tokens/s of one replica")

    @model_validator(mode="before")
    @classmethod
    def _derive_from_gpu_hour(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("gpu_hour_usd") is None:
            return data
        if "input_per_mtok" in data or "output_per_mtok" in data:
            raise ValueError("give either input_per_mtok/output_per_mtok or gpu_hour_usd/tokens_per_second, not both")
        tps = data.get("tokens_per_second")
        if tps is None:
            raise ValueError("gpu_hour_usd needs tokens_per_second > 0 (measured throughput of one replica)")
        try:
            throughput = Decimal(str(tps))
        except InvalidOperation as exc:
            raise ValueError(f"tokens_per_second must be a number > 0, got {tps!r}") from exc
        if not throughput.is_finite() or throughput <= 0:
            raise ValueError("gpu_hour_usd needs tokens_per_second > 0 (measured throughput of one replica)")
        per_mtok = mtok_price_from_gpu_hour(usd_to_micro(data["gpu_hour_usd"]), throughput)
        usd = str(Decimal(per_mtok) / 1_000_000)  # the field validators parse USD
        return {**data, "input_per_mtok": usd, "output_per_mtok": usd}

    @field_validator("input_per_mtok", "output_per_mtok", "gpu_hour_usd", mode="before")
    @classmethod
    def _parse_usd(cls, value: Any) -> int | None:
        return None if value is None else usd_to_micro(value)

    def cost_micro_usd(self, prompt_tokens: int, completion_tokens: int) -> int:
        """Cost of one request in micro-USD, rounded half up once per request."""
        numerator = prompt_tokens * self.input_per_mtok + completion_tokens * self.output_per_mtok
        return (numerator + 500_000) // 1_000_000
