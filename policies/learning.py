"""The policy's `learning:` section: what the gateway keeps of its own traffic so the router can learn from it.

Both parts are off by default. Kept prompts are user data (the text of their requests): turn them on only
where that is allowed, with a TTL that matches the retention you promise.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from policies.frozen import Frozen
from policies.money import usd_to_micro

__all__ = ["KeepPrompts", "Learning", "Shadow"]


class KeepPrompts(Frozen):
    """Keep a sample of scored requests (the text the scorer saw, the score, the pool, the tenant, the time)
    in Redis for `ttl_days`, so feedback, shadow verdicts and cascade escalations can label them."""

    sample: float = Field(default=0.0, ge=0, le=1, description="share of scored requests kept (0: off)")
    ttl_days: int = Field(default=30, ge=1, le=366, description="days a kept prompt and its labels live")


class Shadow(Frozen):
    """Ask the flagship too, off the response path, for a share of kept requests that the micro pool answered,
    and have a judge pool say which answer is better (shown in an order drawn per request; with `both_orders`,
in both orders). Both calls are priced and recorded in the
    ledger (status "shadow", tenant "cascade.shadow"), never charged to the client's tenant; a daily budget
    caps what they spend."""

    sample: float = Field(default=0.0, ge=0, le=1, description="share of kept micro answers compared (0: off)")
    flagship_pool: str | None = Field(default=None, description="pool asked for the reference answer "
                                      "(default: routing.flagship_pool)")
    judge_pool: str | None = Field(default=None, description="pool that judges the two answers")
    daily_budget_usd: int = Field(default=0, description="USD per UTC day for shadow and judge calls together, "
                                  "e.g. 5.00 (0: no calls)", json_schema_extra={"type": ["string", "number"]})
    max_tokens: int = Field(default=512, ge=1, le=32_768, description="completion limit of the flagship call")
    max_in_flight: int = Field(default=2, ge=1, le=64, description="comparisons at once per gateway process; "
                               "more are skipped, not queued")
    both_orders: bool = Field(default=False, strict=True, description="judge each pair twice, the answers "
                              "swapped, and keep a verdict only when both orders agree (twice the judge's cost; "
                              "the second call is skipped when the budget is spent)")

    @field_validator("daily_budget_usd", mode="before")
    @classmethod
    def _parse_usd(cls, value: Any) -> int:
        return usd_to_micro(value)


class Learning(Frozen):
    keep_prompts: KeepPrompts = KeepPrompts()
    shadow: Shadow = Shadow()
