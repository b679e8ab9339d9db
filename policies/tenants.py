"""Tenants: who may call, with which key, at what priority, within which limits and budget."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from policies.cache import ResponseCache
from policies.frozen import Frozen
from policies.guards import Guards
from policies.money import usd_to_micro
from policies.output_checks import OutputChecks

__all__ = ["Budget", "RateLimits", "Tenant"]


class RateLimits(Frozen):
    """Per-tenant limits over a sliding minute, shared by every gateway process through Redis."""

    requests_per_minute: int | None = Field(default=None, ge=1)
    tokens_per_minute: int | None = Field(default=None, ge=1, description="prompt + max completion tokens")


_USD: dict[str, Any] = {"anyOf": [{"type": ["string", "number"]}, {"type": "null"}]}
"""JSON Schema of a USD amount as ops write it ("25.00" or 25); stored as integer micro-USD."""


class Budget(Frozen):
    """Spend limits in USD (stored as integer micro-USD). Days and months are UTC."""

    daily_usd: int | None = Field(default=None, description="USD per UTC day, e.g. 25.00", json_schema_extra=_USD)
    monthly_usd: int | None = Field(default=None, description="USD per UTC month, e.g. 500.00",
                                    json_schema_extra=_USD)
    soft_limit_pct: int = Field(default=80, ge=1, le=100, description="warn (logs, metrics) past this share")
    on_exceed: Literal["reject", "downgrade"] = Field(
        default="reject", description="reject with 429, or downgrade every request to the micro pool"
    )

    @field_validator("daily_usd", "monthly_usd", mode="before")
    @classmethod
    def _parse_usd(cls, value: Any) -> int | None:
        return None if value is None else usd_to_micro(value)


class Tenant(Frozen):
    api_key_sha256: tuple[str, ...] = Field(default=(), description="hex SHA-256 of each API key")
    threshold: float | None = Field(default=None, ge=0, le=1)
    allowed_pools: tuple[str, ...] | None = Field(
        default=None, description="pools this tenant may use (default: all); the first generative one is its "
        "fallback"
    )
    priority: int = Field(default=0, description="higher is more important; the ladder sheds low priority first")
    rate_limits: RateLimits = RateLimits()
    budget: Budget = Budget()
    guards: Guards = Field(default=Guards(), description="input guards applied before routing: PII, size, "
                           "language (policies.guards)")
    output_checks: OutputChecks | None = Field(default=None, description="checks of the answers this tenant gets "
                                               "(policies.output_checks); they win over the pool's")
    on_redis_outage: Literal["fail_open", "fail_closed"] = Field(
        default="fail_open",
        description="when Redis cannot be reached, so this tenant's rate limits or budget cannot be checked: "
        "fail_open (the default) admits the request unchecked, since a storage outage must not become a full "
        "outage and its spend is still recorded (ledger outbox); fail_closed refuses it with 503, for tenants "
        "whose limits must never be overrun. Tenants without limits or budget are never checked, so never refused",
    )
    cache: ResponseCache | None = Field(default=None, description="answers kept in Redis and served again at no "
                                        "engine cost (policies.cache); off when absent")
