"""The rates a cost report's figures were derived from: one line per pool under the table, and the same as fields.

A GPU-hour price is stated with the throughputs it was divided by (`policies.money`), so finance can see why a
prompt token and a completion token cost what they do; a per-token price is stated as given. The flagship's
line is always there: the savings column prices every request's own tokens at its prompt and completion rates.

The rates come from the policy the report is given (the running one for `GET /admin/costs`). Each record is
priced when it is written, so after a price change within the range the older records carry the older rates.
Rates are shown from integer micro-USD through `Decimal`; no float carries money.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from policies.money import Price
from policies.schema import Policy

__all__ = ["PoolRate", "PriceBasis", "price_basis"]


def _dollars(micro: int) -> str:
    """Exact USD with at least 2 decimals: 2_500_000 -> "2.50", 289_352 -> "0.289352"."""
    whole, frac = divmod(micro, 1_000_000)
    digits = f"{frac:06d}".rstrip("0").ljust(2, "0")
    return f"{whole:,}.{digits}"


def _per_m(micro_per_mtok: int) -> str:
    """A derived USD-per-million rate to 3 significant figures (at least 2 decimals): 28_935 -> "0.0289"."""
    amount = Decimal(micro_per_mtok) / 1_000_000
    if amount == 0:
        return "0.00"
    places = max(2, 2 - amount.adjusted())
    return f"{amount.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP):,f}"


def _tps(rate: float) -> str:
    return f"{rate:,g}"


@dataclass(frozen=True, slots=True)
class PoolRate:
    """One pool's price as the report states it; `price` None for a pool the policy no longer has."""

    pool: str
    price: Price | None
    flagship: bool = False

    def line(self) -> str:
        p, note = self.price, " [flagship: the savings column prices the same tokens at these rates]"
        if p is None:
            return f"{self.pool}: not in the policy, price unknown"
        text = f"{self.pool}: " + self._rates(p)
        return text + (note if self.flagship else "")

    @staticmethod
    def _rates(p: Price) -> str:
        prompt, completion = _per_m(p.input_per_mtok), _per_m(p.output_per_mtok)
        if p.gpu_hour_usd is None:
            return (f"${_dollars(p.input_per_mtok)}/M prompt tokens, ${_dollars(p.output_per_mtok)}/M completion "
                    "tokens (per-token price)")
        hour = f"${_dollars(p.gpu_hour_usd)}/GPU-h"
        if p.form == "gpu_hour_flat" and p.tokens_per_second is not None:
            return (f"{hour} at {_tps(p.tokens_per_second)} tok/s, prompt and completion alike (the single "
                    f"tokens_per_second) -> ${prompt}/M tokens")
        return (f"{hour}, prefill {_tps(p.prefill_rate or 0)} tok/s -> ${prompt}/M prompt tokens, "
                f"decode {_tps(p.decode_rate or 0)} tok/s -> ${completion}/M completion tokens")

    def fields(self) -> dict[str, Any]:
        """Machine-readable: the form, the inputs it was derived from and the micro-USD per million tokens."""
        p = self.price
        if p is None:
            return {"pool": self.pool, "form": None, "flagship": self.flagship, "line": self.line()}
        return {"pool": self.pool, "form": p.form, "flagship": self.flagship,
                "gpu_hour_micro_usd": p.gpu_hour_usd, "prefill_tokens_per_second": p.prefill_tokens_per_second,
                "decode_tokens_per_second": p.decode_tokens_per_second, "tokens_per_second": p.tokens_per_second,
                "prompt_micro_usd_per_mtok": p.input_per_mtok, "completion_micro_usd_per_mtok": p.output_per_mtok,
                "line": self.line()}


@dataclass(frozen=True, slots=True)
class PriceBasis:
    """The rates of the report's pools, from the policy at `source`; `unavailable` says why there are none."""

    source: str
    rates: tuple[PoolRate, ...] = ()
    unavailable: str | None = None

    def lines(self) -> list[str]:
        """Report lines (table, HTML): a heading, then one line per pool."""
        if self.unavailable is not None:
            return [f"prices unavailable ({self.unavailable})"]
        head = (f"prices the costs were derived from (policy {self.source}; a record is priced when written, so "
                "one from before a price change carries the older rate):")
        return [head, *(f"  {r.line()}" for r in self.rates)]

    def fields(self) -> dict[str, Any]:
        return {"source": self.source, "unavailable": self.unavailable, "pools": [r.fields() for r in self.rates]}


def price_basis(pools: Iterable[str], policy: Policy, source: str) -> PriceBasis:
    """The rates of `pools` (a report's) and of the policy's flagship, in that order, each once."""
    flagship = policy.routing.flagship_pool
    names = list(dict.fromkeys([*pools, flagship]))
    rates = tuple(PoolRate(name, spec.price if (spec := policy.pools.get(name)) else None, name == flagship)
                  for name in names)
    return PriceBasis(source, rates)
