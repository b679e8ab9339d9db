"""The routing policy, as ops write it in YAML: frozen pydantic models, unknown keys rejected.

Money is parsed from decimal strings/numbers into integer micro-USD; floats never carry money.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "Budget",
    "Cascade",
    "EngineSpec",
    "LocalPool",
    "Policy",
    "Pool",
    "Price",
    "RateLimits",
    "RemotePool",
    "Routing",
    "Rule",
    "RuleMatch",
    "Tenant",
]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _usd_to_micro(value: Any) -> int:
    try:
        amount = Decimal(str(value))
    except InvalidOperation as exc:
        raise ValueError(f"not a price in USD: {value!r}") from exc
    if amount < 0 or not amount.is_finite():
        raise ValueError(f"a price must be a finite amount >= 0 USD, got {value!r}")
    micro = amount * 1_000_000
    if micro != micro.to_integral_value():
        raise ValueError(f"{value!r} USD has more precision than one micro-USD")
    return int(micro)


class Price(_Frozen):
    """USD per million tokens, stored as integer micro-USD per million tokens."""

    input_per_mtok: int = Field(description="USD per 1M prompt tokens, e.g. 0.20")
    output_per_mtok: int = Field(description="USD per 1M completion tokens, e.g. 0.60")

    @field_validator("input_per_mtok", "output_per_mtok", mode="before")
    @classmethod
    def _parse_usd(cls, value: Any) -> int:
        return _usd_to_micro(value)

    def cost_micro_usd(self, prompt_tokens: int, completion_tokens: int) -> int:
        """Cost of one request in micro-USD, rounded half up once per request."""
        numerator = prompt_tokens * self.input_per_mtok + completion_tokens * self.output_per_mtok
        return (numerator + 500_000) // 1_000_000


class EngineSpec(_Frozen):
    """How the supervisor starts one vLLM OpenAI-compatible server per replica."""

    model: str = Field(description="model directory or hub id; 'demo:micro' / 'demo:flagship' for demo models")
    served_name: str = Field(description="name the engine serves and the gateway forwards as `model`")
    replicas: int = Field(default=1, ge=1, le=64)
    max_model_len: int = Field(default=1024, ge=64)
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    quantization: str | None = None
    kv_cache_space_gib: int | None = Field(default=None, ge=1, description="CPU engines: VLLM_CPU_KVCACHE_SPACE")
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    speculative_config: dict[str, Any] | None = None
    tensor_parallel_size: int = Field(default=1, ge=1)
    pipeline_parallel_size: int = Field(default=1, ge=1)
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    base_port: int = Field(default=8100, ge=1024, le=65000)
    startup_timeout_s: float = Field(default=600, gt=0)


class LocalPool(_Frozen):
    type: Literal["local"]
    price: Price
    engine: EngineSpec
    description: str = ""


class RemotePool(_Frozen):
    type: Literal["remote"]
    price: Price
    urls: tuple[str, ...] = Field(min_length=1, description="base URLs of OpenAI-compatible servers")
    model: str = Field(description="model name sent to the remote servers")
    api_key_env: str | None = Field(default=None, description="environment variable holding the API key")
    description: str = ""


Pool = Annotated[LocalPool | RemotePool, Field(discriminator="type")]


class RuleMatch(_Frozen):
    """All given conditions must hold (AND). An empty match always matches."""

    tenants: tuple[str, ...] | None = None
    models: tuple[str, ...] | None = Field(default=None, description="requested model names/aliases")
    min_prompt_chars: int | None = Field(default=None, ge=0)
    max_prompt_chars: int | None = Field(default=None, ge=0)
    keywords: tuple[str, ...] | None = Field(default=None, description="any keyword, case-insensitive")


class Rule(_Frozen):
    name: str = Field(min_length=1)
    match: RuleMatch = RuleMatch()
    pool: str | None = Field(default=None, description="send matching requests to this pool")
    threshold: float | None = Field(default=None, ge=0, le=1, description="or route by score with this threshold")


class Cascade(_Frozen):
    """Try the micro pool first, escalate to the flagship when its answer looks unsure.

    Applies to `model: auto` requests that the score sent to the micro pool. Confidence is the geometric
    mean of the answer's token probabilities (exp of the mean logprob) over the first `first_tokens`
    tokens when streaming, over the whole answer otherwise. Escalation happens before any byte reaches
    the client; both calls are recorded and priced.
    """

    enabled: bool = False
    min_confidence: float = Field(default=0.3, ge=0, le=1, description="escalate below this confidence")
    first_tokens: int = Field(default=16, ge=1, le=512, description="tokens judged before streaming starts")


class Routing(_Frozen):
    micro_pool: str = Field(description="pool for requests scored below the threshold")
    flagship_pool: str = Field(description="pool for requests scored at or above the threshold")
    threshold: float = Field(default=0.5, ge=0, le=1)
    rules: tuple[Rule, ...] = ()
    cascade: Cascade = Cascade()


class RateLimits(_Frozen):
    """Per-tenant limits over a sliding minute, shared by every gateway process through Redis."""

    requests_per_minute: int | None = Field(default=None, ge=1)
    tokens_per_minute: int | None = Field(default=None, ge=1, description="prompt + max completion tokens")


class Budget(_Frozen):
    """Spend limits in USD (stored as integer micro-USD). Days and months are UTC."""

    daily_usd: int | None = Field(default=None, description="USD per UTC day, e.g. 25.00")
    monthly_usd: int | None = Field(default=None, description="USD per UTC month, e.g. 500.00")
    soft_limit_pct: int = Field(default=80, ge=1, le=100, description="warn (logs, metrics) past this share")
    on_exceed: Literal["reject", "downgrade"] = Field(
        default="reject", description="reject with 429, or downgrade every request to the micro pool"
    )

    @field_validator("daily_usd", "monthly_usd", mode="before")
    @classmethod
    def _parse_usd(cls, value: Any) -> int | None:
        return None if value is None else _usd_to_micro(value)


class Tenant(_Frozen):
    api_key_sha256: tuple[str, ...] = ()
    threshold: float | None = Field(default=None, ge=0, le=1)
    allowed_pools: tuple[str, ...] | None = None
    priority: int = Field(default=0, description="higher is more important; the ladder sheds low priority first")
    rate_limits: RateLimits = RateLimits()
    budget: Budget = Budget()


class Policy(_Frozen):
    version: int = Field(default=1, description="schema version of this file")
    pools: dict[str, Pool] = Field(min_length=1)
    routing: Routing
    tenants: dict[str, Tenant] = Field(default_factory=dict)
    aliases: dict[str, str] = Field(default_factory=dict, description="extra model names that pin a pool")
