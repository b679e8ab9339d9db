"""The routing policy, as ops write it in YAML: frozen pydantic models, unknown keys rejected.

The models live in one module per noun (`money`, `pools`, `rules`, `tenants`, `ladder_schema`) and are
re-exported here, so `from policies.schema import Policy, Price, ...` is the one import callers need.
Money is parsed from decimal strings/numbers into integer micro-USD; floats never carry money.
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, field_validator, model_validator

from policies.batches import Batches
from policies.frozen import Frozen
from policies.ladder_schema import (
    Action,
    Degradation,
    FallbackPool,
    ForceStream,
    LadderStep,
    Overflow,
    RaiseThreshold,
    Shed,
    Signal,
    TruncateContext,
)
from policies.learning import KeepPrompts, Learning, Shadow
from policies.money import Price, usd_to_micro
from policies.output_checks import OutputChecks, Repetition
from policies.pools import Canary, CanaryGuard, EngineSpec, LocalPool, Pool, RemotePool
from policies.rules import Rule, RuleMatch
from policies.tenants import Budget, RateLimits, Tenant
from policies.threshold import ShareThreshold, Threshold

__all__ = [
    "Action",
    "Batches",
    "Budget",
    "Canary",
    "CanaryGuard",
    "Cascade",
    "Degradation",
    "EngineSpec",
    "FallbackPool",
    "ForceStream",
    "KeepPrompts",
    "LadderStep",
    "Learning",
    "LocalPool",
    "OutputChecks",
    "Overflow",
    "Policy",
    "Pool",
    "Price",
    "RaiseThreshold",
    "RateLimits",
    "RemotePool",
    "Repetition",
    "Routing",
    "Rule",
    "RuleMatch",
    "Shadow",
    "ShareThreshold",
    "Shed",
    "Signal",
    "Tenant",
    "TruncateContext",
]


_USD: dict[str, Any] = {"anyOf": [{"type": ["string", "number"]}, {"type": "null"}]}
"""JSON Schema of a USD amount as ops write it ("0.50" or 0.5); stored as integer micro-USD."""


def _tiers_or_ends(schema: dict[str, Any]) -> None:
    """JSON Schema as ops write it: `tiers`, or both micro_pool and flagship_pool."""
    schema["required"] = [k for k in schema.get("required", ()) if k not in ("micro_pool", "flagship_pool")]
    schema["anyOf"] = [{"required": ["tiers"]}, {"required": ["micro_pool", "flagship_pool"]}]


class Cascade(Frozen):
    """Try the micro pool first, escalate to the flagship when its answer looks unsure.

    Applies to `model: auto` requests that the score sent to the micro pool. Confidence is the geometric
    mean of the answer's token probabilities (exp of the mean logprob) over the first `first_tokens`
    tokens when streaming, over the whole answer otherwise. Escalation happens before any byte reaches
    the client; both calls are recorded and priced.
    """

    enabled: bool = False
    min_confidence: float = Field(default=0.3, ge=0, le=1, description="escalate below this confidence")
    first_tokens: int = Field(default=16, ge=1, le=512, description="tokens judged before streaming starts")


class Routing(Frozen):
    """The default split by score (`threshold`, a float or a target flagship share: `policies.threshold`), then
    `rules` tried in order: the first match wins. With `tiers`, a request no rule sends goes to the tier with the
    best trade of predicted quality against expected cost (`policies.tiers`), and `micro_pool` / `flagship_pool`
    default to the first and the last tier."""

    model_config = ConfigDict(frozen=True, extra="forbid", json_schema_extra=_tiers_or_ends)

    micro_pool: str = Field(description="pool for requests scored below the threshold (with tiers: the first)")
    flagship_pool: str = Field(description="pool for requests scored at or above the threshold (with tiers: the "
                               "last)")
    tiers: tuple[str, ...] | None = Field(
        default=None, description="pools cheapest first: each request goes to the one with the best trade of "
        "predicted quality (its `placement` on the pool map) against expected cost (policies.tiers)")
    tradeoff: float | None = Field(
        default=None, description="with tiers: the quality one USD of expected cost per request is worth (>= 0; "
        "0 picks the best predicted quality whatever it costs); default 0 unless cost_per_1k is given")
    cost_per_1k: int | None = Field(
        default=None, description="with tiers: a target mean cost per 1,000 requests in USD, e.g. 0.50; the "
        "gateway sets the tradeoff live across workers to hold it", json_schema_extra=_USD)
    expected_completion_tokens: int = Field(
        default=256, ge=1, description="completion tokens a request is expected to produce, for its expected "
        "cost (a pool's own expected_completion_tokens wins)")
    threshold: Threshold = Field(default=0.5, description="score at or above it goes to the flagship, or "
                                 "{flagship_share: X} to keep that share of scored auto requests on the flagship")
    rules: tuple[Rule, ...] = ()
    cascade: Cascade = Cascade()
    failover: bool = Field(
        default=True,
        description="when the chosen pool cannot answer a request before any byte was sent (no replica can take "
        "it, or every replica tried answered 5xx), try the other tier (micro <-> flagship; with tiers: the next tier "
        "that fits, up first, then down), where the tenant's allowed pools, budget and the ladder's shedding let it "
        "go; false: the client gets the 503 or 502",
    )

    @model_validator(mode="before")
    @classmethod
    def _ends_of_tiers(cls, data: Any) -> Any:
        """With `tiers`, a missing micro_pool / flagship_pool is the first / last tier."""
        if not isinstance(data, dict) or not isinstance(data.get("tiers"), list | tuple) or not data["tiers"]:
            return data
        return {"micro_pool": data["tiers"][0], "flagship_pool": data["tiers"][-1], **data}

    @field_validator("tradeoff", mode="before")
    @classmethod
    def _non_negative(cls, value: Any) -> Any:
        if isinstance(value, int | float) and not isinstance(value, bool) and not value >= 0:
            raise ValueError(f"tradeoff {value} is negative: it is the quality one USD of expected cost is worth, "
                             ">= 0 (0 picks the best predicted quality whatever it costs); use 0 or more")
        return value

    @field_validator("cost_per_1k", mode="before")
    @classmethod
    def _parse_usd(cls, value: Any) -> int | None:
        return None if value is None else usd_to_micro(value)


class Policy(Frozen):
    version: int = Field(default=1, description="schema version of this file")
    pools: dict[str, Pool] = Field(min_length=1)
    routing: Routing
    tenants: dict[str, Tenant] = Field(default_factory=dict)
    aliases: dict[str, str] = Field(default_factory=dict, description="extra model names that pin a pool")
    degradation: Degradation = Degradation()
    learning: Learning = Learning()
    batches: Batches = Batches()
    output_checks: OutputChecks | None = Field(default=None, description="checks of every pool's answers "
                                               "(policies.output_checks); a pool's or tenant's block wins")
    default_max_tokens: int | None = Field(default=None, ge=1, description=(
        "the completion limit (tokens per choice) the gateway sends for a request that sets none, and that the "
        "tenant's budget holds; at most the context left after the prompt, which applies alone when this is unset "
        "(gateway.serving.routing.completion_limit). It must be below every pool's context"))
