"""Prices: USD as ops write it, integer micro-USD inside. Floats never carry money.

A pool is priced in one of two forms:

- per token: ``{input_per_mtok: "0.20", output_per_mtok: "0.60"}`` (USD per million tokens);
- per GPU-hour: ``{gpu_hour_usd: "2.50", prefill_tokens_per_second: 24000, decode_tokens_per_second: 2400}``,
  where ``gpu_hour_usd`` is what one replica's hardware costs per hour (all its GPUs) and the two throughputs
  are that replica's measured tokens/s at full load on prompts (prefill) and on completions (decode);
  `python -m loadtest.bench.saturation` measures both and prints the block. A replica-second costs the same
  whichever kind of token it spends, and prefill runs many times faster per token than decode, so each
  per-token price is the GPU-second's price over its own throughput::

      micro-USD per Mtok = round_half_up(gpu_hour_usd * 10**6 * 10**6 / (throughput * 3600))

  e.g. 2.50 USD/h: prompts at 24,000 tok/s -> 28_935 micro-USD (0.028935 USD) per million prompt tokens,
  completions at 2,400 tok/s -> 289_352 micro-USD per million completion tokens.

  The older ``{gpu_hour_usd, tokens_per_second}`` still loads: one blended throughput, so prompt and
  completion tokens get the same price (which overstates what long prompts cost). Given beside the two split
  rates it must lie between them (any blend of the two does); the split rates then set the prices.
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from policies.frozen import Frozen

__all__ = ["PRICE_FORMS", "Price", "PriceForm", "mtok_price_from_gpu_hour", "usd_to_micro"]

PriceForm = Literal["per_token", "gpu_hour", "gpu_hour_flat"]
PRICE_FORMS: tuple[PriceForm, ...] = ("per_token", "gpu_hour", "gpu_hour_flat")
_PREFILL, _DECODE, _FLAT = "prefill_tokens_per_second", "decode_tokens_per_second", "tokens_per_second"


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


def _throughput(data: dict[str, Any], name: str) -> Decimal | None:
    """`data[name]` as a throughput > 0 (None when absent). Raises ValueError naming the key."""
    value = data.get(name)
    if value is None:
        return None
    try:
        rate = Decimal(str(value)) if not isinstance(value, bool) else Decimal("NaN")
    except InvalidOperation:
        rate = Decimal("NaN")
    if not rate.is_finite() or rate <= 0:
        raise ValueError(f"{name} must be a number > 0 (tokens/s of one replica), got {value!r}")
    return rate


def _gpu_hour_rates(data: dict[str, Any]) -> tuple[Decimal, Decimal]:
    """(prompt, completion) throughput a GPU-hour price divides by. Raises ValueError for a missing, half-given,
    non-positive or inconsistent throughput."""
    prefill, decode, flat = _throughput(data, _PREFILL), _throughput(data, _DECODE), _throughput(data, _FLAT)
    if (prefill is None) != (decode is None):
        raise ValueError(f"give both {_PREFILL} and {_DECODE}: a GPU-hour price needs one replica's throughput "
                         "on prompts and on completions")
    if prefill is None or decode is None:
        if flat is None:
            raise ValueError(f"gpu_hour_usd needs the measured throughput of one replica: {_PREFILL} and {_DECODE} "
                             f"(`python -m loadtest.bench.saturation` measures them), or the older single {_FLAT}")
        return flat, flat
    if flat is not None and not min(prefill, decode) <= flat <= max(prefill, decode):
        raise ValueError(f"{_FLAT} {data[_FLAT]!r} is not between {_DECODE} {data[_DECODE]!r} and {_PREFILL} "
                         f"{data[_PREFILL]!r} (a blend of the two lies between them); remove {_FLAT}: the two "
                         "split rates set the prices")
    return prefill, decode


def _prompts_only(data: dict[str, Any]) -> bool:
    """A GPU-hour price of a pool that generates nothing (an embedding pool): the prefill rate, output_per_mtok 0
    (`policies.pools` fills it in for `kind: embedding`), no decode rate and no input_per_mtok."""
    if data.get(_PREFILL) is None or _DECODE in data or _FLAT in data or "input_per_mtok" in data:
        return False
    return data.get("output_per_mtok") is not None and usd_to_micro(data["output_per_mtok"]) == 0


def _document_forms(schema: dict[str, Any]) -> None:
    """JSON Schema as ops write it: USD as strings or numbers, and one of the forms."""
    for name in ("input_per_mtok", "output_per_mtok", "gpu_hour_usd"):
        schema["properties"][name] = {**schema["properties"][name], "type": ["string", "number"]}
        schema["properties"][name].pop("anyOf", None)
    schema.pop("required", None)
    # the single rate with the split ones is the split form (the loader checks it lies between them)
    schema["oneOf"] = [{"required": ["input_per_mtok", "output_per_mtok"]},
                       {"required": ["gpu_hour_usd", _PREFILL, _DECODE]},
                       {"required": ["gpu_hour_usd", _PREFILL, "output_per_mtok"],  # an embedding pool's
                        "not": {"anyOf": [{"required": [_DECODE]}, {"required": [_FLAT]}]}},
                       {"required": ["gpu_hour_usd", _FLAT], "not": {"anyOf": [{"required": [_PREFILL]},
                                                                              {"required": [_DECODE]}]}}]


class Price(Frozen):
    """Integer micro-USD per million tokens. Give the two per-Mtok prices, or `gpu_hour_usd` with the prefill
    and decode throughputs (or the older single `tokens_per_second`); see the module docstring for the
    formula. Never both forms."""

    model_config = ConfigDict(frozen=True, extra="forbid", json_schema_extra=_document_forms)

    input_per_mtok: int = Field(description="USD per 1M prompt tokens, e.g. 0.20")
    output_per_mtok: int = Field(description="USD per 1M completion tokens, e.g. 0.60")
    gpu_hour_usd: int | None = Field(default=None, description="USD per replica-hour, e.g. 2.50 (derived form)")
    prefill_tokens_per_second: float | None = Field(
        default=None, gt=0, description="prompt tokens/s one replica processes at full load (prices prompt tokens)")
    decode_tokens_per_second: float | None = Field(
        default=None, gt=0, description="completion tokens/s of one replica at full load (prices completion tokens)")
    tokens_per_second: float | None = Field(
        default=None, gt=0, description="older single rate: measured tokens/s of one replica, prompt and completion "
        "alike (both get one price); prefer the prefill and decode rates")

    @model_validator(mode="before")
    @classmethod
    def _derive_from_gpu_hour(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("gpu_hour_usd") is None:
            return data
        hour = usd_to_micro(data["gpu_hour_usd"])
        if _prompts_only(data):  # an embedding pool: prompt tokens only, priced at the prefill rate
            prefill = _throughput(data, _PREFILL)
            assert prefill is not None
            return {**data, "input_per_mtok": str(Decimal(mtok_price_from_gpu_hour(hour, prefill)) / 1_000_000)}
        if "input_per_mtok" in data or "output_per_mtok" in data:
            raise ValueError("give either input_per_mtok/output_per_mtok or gpu_hour_usd with throughputs, not both")
        prefill, decode = _gpu_hour_rates(data)
        # the field validators parse USD
        usd = {name: str(Decimal(mtok_price_from_gpu_hour(hour, rate)) / 1_000_000)
               for name, rate in (("input_per_mtok", prefill), ("output_per_mtok", decode))}
        return {**data, **usd}

    @field_validator("input_per_mtok", "output_per_mtok", "gpu_hour_usd", mode="before")
    @classmethod
    def _parse_usd(cls, value: Any) -> int | None:
        return None if value is None else usd_to_micro(value)

    @property
    def form(self) -> PriceForm:
        """How the per-token prices were set: given (`per_token`), from a GPU-hour and two throughputs
        (`gpu_hour`), or from a GPU-hour and one throughput for both kinds of token (`gpu_hour_flat`)."""
        if self.gpu_hour_usd is None:
            return "per_token"
        return "gpu_hour" if self.prefill_tokens_per_second is not None else "gpu_hour_flat"

    @property
    def prefill_rate(self) -> float | None:
        """Prompt tokens/s of one replica, as declared (the split rate, else the single one); None if not."""
        return self.prefill_tokens_per_second or self.tokens_per_second

    @property
    def decode_rate(self) -> float | None:
        """Completion tokens/s of one replica, as declared (the split rate, else the single one); None if not."""
        return self.decode_tokens_per_second or self.tokens_per_second

    def cost_micro_usd(self, prompt_tokens: int, completion_tokens: int) -> int:
        """Cost of one request in micro-USD, rounded half up once per request."""
        numerator = prompt_tokens * self.input_per_mtok + completion_tokens * self.output_per_mtok
        return (numerator + 500_000) // 1_000_000
