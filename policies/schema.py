"""The routing policy, as ops write it in YAML: frozen pydantic models, unknown keys rejected.

The models live in one module per noun (`money`, `pools`, `rules`, `tenants`, `ladder_schema`) and are
re-exported here, so `from policies.schema import Policy, Price, ...` is the one import callers need.
Money is parsed from decimal strings/numbers into integer micro-USD; floats never carry money.
"""

from __future__ import annotations

from pydantic import Field

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
from policies.money import Price
from policies.output_checks import OutputChecks, Repetition
from policies.pools import Canary, CanaryGuard, EngineSpec, LocalPool, Pool, RemotePool
from policies.rules import Rule, RuleMatch
from policies.tenants import Budget, RateLimits, Tenant
from policies.threshold import ShareThreshold, Threshold

__all__ = [
    "Action",
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
    `rules` tried in order: the first match wins."""

    micro_pool: str = Field(description="pool for requests scored below the threshold")
    flagship_pool: str = Field(description="pool for requests scored at or above the threshold")
    threshold: Threshold = Field(default=0.5, description="score at or above it goes to the flagship, or "
                                 "{flagship_share: X} to keep that share of scored auto requests on the flagship")
    rules: tuple[Rule, ...] = ()
    cascade: Cascade = Cascade()
    failover: bool = Field(
        default=True,
        description="when the chosen pool cannot answer a request before any byte was sent (no replica can take "
        "it, or every replica tried answered 5xx), try the other tier (micro <-> flagship), where the tenant's "
        "allowed pools, budget and the ladder's shedding let it go; false: the client gets the 503 or 502",
    )


class Policy(Frozen):
    version: int = Field(default=1, description="schema version of this file")
    pools: dict[str, Pool] = Field(min_length=1)
    routing: Routing
    tenants: dict[str, Tenant] = Field(default_factory=dict)
    aliases: dict[str, str] = Field(default_factory=dict, description="extra model names that pin a pool")
    degradation: Degradation = Degradation()
    learning: Learning = Learning()
    output_checks: OutputChecks | None = Field(default=None, description="checks of every pool's answers "
                                               "(policies.output_checks); a pool's or tenant's block wins")
