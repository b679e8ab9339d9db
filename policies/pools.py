"""Pools: where a request can go. `local` pools are engines the gateway's supervisor starts; `remote` pools
are OpenAI-compatible servers someone else runs (other hosts, or a cloud endpoint for overflow)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, Self

from pydantic import Field, model_validator

from policies.autoscale import Autoscale
from policies.frozen import Frozen
from policies.money import Price
from policies.output_checks import OutputChecks
from policies.parallelism import OnDemand, RaySettings, parallelism_problems
from policies.speculative import Speculation
from policies.tool_calling import ToolCalling

__all__ = ["POOLING_RUNNER", "POOL_KINDS", "Canary", "CanaryGuard", "EngineSpec", "LocalPool", "Pool", "PoolBase",
           "PoolKind", "QuantCeiling", "RemotePool", "ReplicaChoice", "as_remote_pool", "context_of", "engine_version",
           "flag_value", "is_embedding", "pool_version"]

PoolKind = Literal["generative", "embedding"]
POOL_KINDS: tuple[PoolKind, ...] = ("generative", "embedding")
_KIND_DOC = ("what the pool's engines serve: generative (chat, Responses, completions: the routing targets) or "
             "embedding (/v1/embeddings only: never a routing target; billed per input token)")
POOLING_RUNNER = ("--runner", "pooling")
"""vLLM's pooling runner: an embedding pool's engines are started with it (a *ForCausalLM checkpoint is converted to
an embedding model, `--convert auto` resolving to `embed`; a native embedding model is served as it is)."""


def _embedding_defaults(data: Any) -> Any:
    """An embedding pool as written, with what `kind: embedding` implies filled in: its price's output_per_mtok 0
    (only input tokens are billed) and, on a local pool's engines, vLLM's pooling runner (`POOLING_RUNNER`) unless
    its extra_args choose a runner."""
    if not isinstance(data, Mapping) or data.get("kind") != "embedding":
        return data
    data = dict(data)
    price = data.get("price")
    if isinstance(price, Mapping) and "output_per_mtok" not in price and _prices_prompts(price):
        data["price"] = {**price, "output_per_mtok": 0}  # with a GPU-hour: the prefill rate alone sets the price
    if isinstance(data.get("engine"), Mapping):
        data["engine"] = _with_pooling_runner(data["engine"])
    canary = data.get("canary")
    if isinstance(canary, Mapping) and isinstance(canary.get("engine"), Mapping):
        data["canary"] = {**canary, "engine": _with_pooling_runner(canary["engine"])}
    return data


def _prices_prompts(price: Mapping[str, Any]) -> bool:
    """A price as written that prices prompt tokens alone: per token, or a GPU-hour with no completion rate."""
    rates = {"prefill_tokens_per_second", "decode_tokens_per_second", "tokens_per_second"} & set(price)
    prefill_alone = rates == {"prefill_tokens_per_second"}
    return "input_per_mtok" in price or ("gpu_hour_usd" in price and prefill_alone)


def _with_pooling_runner(engine: Mapping[str, Any]) -> dict[str, Any]:
    extra = engine.get("extra_args") or ()
    if not isinstance(extra, list | tuple) or any(str(a).split("=", 1)[0] == "--runner" for a in extra):
        return dict(engine)
    return {**engine, "extra_args": [*POOLING_RUNNER, *extra]}


def _kind_problems(kind: PoolKind, engines: Sequence[EngineSpec], output_checks: object, price: Price) -> list[str]:
    """What a pool of `kind` may not have: an embedding pool's engines run vLLM's pooling runner and have no
    speculative decoding nor tool calling, and its answers (vectors) no output checks; a generative pool's engines
    do not run the pooling runner, and its GPU-hour price has a decode rate (it prices completion tokens)."""
    problems = []
    if kind == "generative" and price.form == "gpu_hour" and price.decode_rate is None:
        problems.append("a GPU-hour price needs decode_tokens_per_second to price completion tokens (only an "
                        "embedding pool's price may leave it out)")
    for engine in engines:
        runner = flag_value(engine.extra_args, "--runner")
        if kind == "embedding" and runner not in (None, "pooling"):
            problems.append(f"an embedding pool's engine runs vLLM's pooling runner; remove --runner {runner}")
        if kind == "generative" and runner == "pooling":
            problems.append("the engine runs vLLM's pooling runner (embeddings): set kind: embedding on the pool")
        if kind == "embedding" and (engine.speculative is not None or engine.tool_calling is not None):
            problems.append("an embedding pool generates no tokens: remove speculative and tool_calling")
    if kind == "embedding" and output_checks is not None:
        problems.append("an embedding pool's answers are vectors, which no output check reads: remove output_checks")
    return problems


def flag_value(extra_args: Sequence[str], flag: str) -> str | None:
    """The value `extra_args` give vLLM's `flag` (`--flag value` or `--flag=value`); None where they do not."""
    for i, arg in enumerate(extra_args):
        name, _, value = arg.partition("=")
        if name == flag:
            return value or (extra_args[i + 1] if i + 1 < len(extra_args) else "")
    return None


class EngineSpec(Frozen):
    """How the supervisor starts one vLLM OpenAI-compatible server per replica."""

    model: str = Field(description="model directory or hub id; 'demo:micro' / 'demo:flagship' for demo models")
    served_name: str = Field(description="name the engine serves and the gateway forwards as `model`")
    replicas: int = Field(default=1, ge=1, le=64)
    max_model_len: int = Field(default=1024, ge=64)
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    quantization: str | None = Field(default=None, description="vLLM --quantization, e.g. awq, fp8")
    kv_cache_space_gib: int | None = Field(default=None, ge=1, description="CPU engines: VLLM_CPU_KVCACHE_SPACE")
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    speculative: Speculation | None = Field(default=None, description="speculative decoding: {method: ngram | "
                                            "draft, num_speculative_tokens, ...} (policies/speculative.py)")
    tensor_parallel_size: int = Field(default=1, ge=1)
    pipeline_parallel_size: int = Field(default=1, ge=1)
    data_parallel_size: int = Field(default=1, ge=1, description="vLLM --data-parallel-size (engine-internal DP)")
    enable_expert_parallel: bool = Field(default=False, description="vLLM --enable-expert-parallel (MoE only)")
    moe: bool | None = Field(default=None, description="the model is a mixture of experts (demo:flagship is)")
    gpus_per_node: int | None = Field(default=None, ge=1, description="GPUs one replica may use on each node")
    nodes: int = Field(default=1, ge=1, description="nodes one replica spans (more than 1 needs Ray)")
    distributed_executor_backend: Literal["mp", "ray"] | None = Field(
        default=None, description="vLLM --distributed-executor-backend")
    ray: RaySettings | None = Field(default=None, description="the Ray cluster for multi-node replicas")
    tool_calling: ToolCalling | None = Field(default=None, description="the tool-call parser (and chat template) "
                                             "that let `tool_choice: auto` work (policies/tool_calling.py)")
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    pin_engine_core: bool = Field(
        default=True, description="CPU engines: bind vLLM's busy-polling engine-core process to the cores of its "
        "model worker, so that it does not starve the API server (backends/engines/cpu_pinning.py)")
    base_port: int = Field(default=8100, ge=1024, le=65000)
    startup_timeout_s: float = Field(default=600, gt=0)
    hang_restart_after_s: float | None = Field(
        default=120, gt=0, description="restart a replica whose process is alive but has answered neither a health "
        "check nor a request for this long (seconds; null: never). Requests count, so a saturated engine that "
        "answers /health late but keeps serving is left alone")

    @model_validator(mode="before")
    @classmethod
    def _no_free_speculative_config(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "speculative_config" in data:
            raise ValueError("speculative_config was replaced by speculative: {method: ngram | draft, "
                             "num_speculative_tokens: N, ...} (docs/engines.md)")
        return data

    @model_validator(mode="after")
    def _parallelism_fits(self) -> EngineSpec:
        problems = parallelism_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self


class QuantCeiling(Frozen):
    """The most loss a quantized pool may show (figures of `cascade quantize --evaluate`) to be allowed."""

    max_disagreement: float | None = Field(default=None, ge=0, le=1,
                                           description="greedy-token disagreement with the original, 0..1")
    max_kl: float | None = Field(default=None, ge=0, description="mean next-token KL divergence, nats")
    min_json_valid: float | None = Field(default=None, ge=0, le=1,
                                         description="share of schema-constrained answers that stay valid JSON")



class Breaker(Frozen):
    """Each replica's circuit breaker (`backends.clients.breaker`): when it opens, and for how long."""

    failure_threshold: int = Field(default=5, ge=1, description="consecutive failures that open it")
    error_rate: float = Field(default=0.5, gt=0, le=1, description="or this share of failures in the window...")
    min_requests: int = Field(default=20, ge=1, description="...over at least this many requests")
    window_s: float = Field(default=10.0, gt=0, description="the error-rate window, seconds")
    cooldown_s: float = Field(default=5.0, ge=0, description="open this long, then one half-open probe")


class ReplicaChoice(Frozen):
    """Which replica of the pool takes a new request: the one with the least weighted load
    (`backends.clients.pool.Replica.cost`), each weight per unit of its signal. The gateway's own requests in
    flight are exact; the engine's gauges (running, waiting, KV cache usage 0..1) lag by one probe."""

    in_flight: float = Field(default=1.0, ge=0, description="per request this gateway has in flight there")
    running: float = Field(default=0.5, ge=0, description="per request the engine reports running")
    queue: float = Field(default=2.0, ge=0, description="per request the engine reports waiting")
    kv_cache: float = Field(default=4.0, ge=0, description="per unit of KV cache usage (0..1) the engine reports")


class CanaryGuard(Frozen):
    """Roll a canary back by itself when, over its last `window_s` seconds and at least `min_requests` requests,
    its error rate or its p95 time to first token passes a bound (`gateway.control.fleet.canaries.CanaryGuard`)."""

    max_error_rate: float | None = Field(default=None, gt=0, le=1, description="share of the canary's requests "
                                         "that failed (no replica, an engine error, a broken stream)")
    max_p95_ttft_ms: float | None = Field(default=None, gt=0, description="p95 time to first token, milliseconds")
    min_requests: int = Field(default=20, ge=1, description="requests in the window before the guard judges")
    window_s: float = Field(default=300.0, gt=0, description="the window, seconds")

    @model_validator(mode="after")
    def _has_a_bound(self) -> CanaryGuard:
        if self.max_error_rate is None and self.max_p95_ttft_ms is None:
            raise ValueError("a canary guard needs max_error_rate or max_p95_ttft_ms (or remove the guard)")
        return self


class Canary(Frozen):
    """A second engine version of a local pool that takes `weight` of its traffic (sticky per conversation:
    `metadata.conversation_id`, else `user`). `cascade pool promote` makes it the pool, `cascade pool rollback`
    removes it (docs/upgrades.md)."""

    engine: EngineSpec
    weight: float = Field(gt=0, lt=1, description="share of the pool's requests sent to the canary (0..1, "
                          "exclusive: promote it to send it everything)")
    guard: CanaryGuard | None = Field(default=None, description="roll back by itself past these bounds")


class PoolBase(Frozen):
    """What a pool of either type has: its price, what the gateway does with its answers and replicas, and
    where it sits on the pool map."""

    kind: PoolKind = Field(default="generative", description=_KIND_DOC)
    price: Price
    output_checks: OutputChecks | None = Field(default=None, description="checks of this pool's answers "
                                               "(policies.output_checks)")
    breaker: Breaker = Field(default_factory=Breaker, description="each replica's circuit breaker")
    replica_choice: ReplicaChoice = Field(default_factory=ReplicaChoice, description="how a new request picks "
                                          "its replica: weights of in-flight, running, queued and KV cache load")
    placement: str | None = Field(default=None, description=(
        "where this pool sits on the pool map (`cascade router place` writes it): a placement file, relative to "
        "the policy file, or the name of a shared source's model; needed for a pool in routing.tiers"))
    expected_completion_tokens: int | None = Field(default=None, ge=1, description=(
        "completion tokens a request is expected to produce here, for its expected cost (default: routing's)"))
    description: str = ""

    @model_validator(mode="before")
    @classmethod
    def _embedding_defaults(cls, data: Any) -> Any:
        return _embedding_defaults(data)

    @model_validator(mode="after")
    def _kind_fits(self) -> Self:
        problems = _kind_problems(self.kind, self._engines(), self.output_checks, self.price)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _engines(self) -> Sequence[EngineSpec]:
        """The engines the gateway starts for this pool (a local pool's own and its canary's; none for a remote)."""
        return ()


class LocalPool(PoolBase):
    type: Literal["local"]
    engine: EngineSpec
    canary: Canary | None = Field(default=None, description="a new engine version taking a share of the traffic")
    autoscale: Autoscale | None = Field(default=None, description="replicas that follow load (policies.autoscale); "
                                        "engine.replicas is the count it starts with")
    on_demand: OnDemand | None = Field(default=None, description="scale to zero: start on demand, stop when idle")
    max_quant_loss: QuantCeiling | None = Field(
        default=None, description="a quantized pool is refused unless its measured loss is within this ceiling "
        "(checked where pools start and by `cascade policy validate`, against that machine's checkpoint)")
    required_for_ready: bool | None = Field(default=None, description=(
        "the gateway is not ready (/readyz 503) while this pool has no ready replica; default: yes, except "
        "for an on_demand pool (asleep is normal for it). An optional pool that is down is reported as "
        "degraded in /readyz"))

    @property
    def needed_for_ready(self) -> bool:
        """Whether /readyz fails while this pool is down (`required_for_ready`, else: unless on demand)."""
        return self.required_for_ready if self.required_for_ready is not None else self.on_demand is None

    def _engines(self) -> Sequence[EngineSpec]:
        return [self.engine, *([self.canary.engine] if self.canary is not None else [])]

    @model_validator(mode="after")
    def _autoscale_fits(self) -> LocalPool:
        scale = self.autoscale
        if scale is None:
            return self
        if not scale.min_replicas <= self.engine.replicas <= scale.max_replicas:
            raise ValueError(f"engine.replicas {self.engine.replicas} is outside autoscale's "
                             f"[{scale.min_replicas}, {scale.max_replicas}]: it is the count the pool starts with")
        if self.on_demand is not None:
            raise ValueError("a pool with on_demand cannot autoscale too (on_demand already scales it to zero)")
        return self

    @model_validator(mode="after")
    def _canary_fits(self) -> LocalPool:
        canary = self.canary
        if canary is None:
            return self
        if canary.engine == self.engine:
            raise ValueError("canary.engine is the pool's own engine: a canary must change something")
        if self.on_demand is not None:
            raise ValueError("a pool with on_demand cannot carry a canary (it has no engines while asleep)")
        ours = set(range(self.engine.base_port, self.engine.base_port + self.engine.replicas))
        theirs = set(range(canary.engine.base_port, canary.engine.base_port + canary.engine.replicas))
        if ours & theirs:
            raise ValueError(f"canary.engine.base_port {canary.engine.base_port}: its ports overlap the pool's "
                             f"({min(ours)}-{max(ours)}); give the canary ports of its own")
        return self


class Connection(Frozen):
    """How the gateway connects to a remote pool's servers (`backends.clients.connection`). Paths are PEM files on the
    gateway's machine, read where the pool starts, not when the policy is parsed."""

    trust_env: bool = Field(default=False, description=(
        "send requests through the proxy of HTTPS_PROXY / HTTP_PROXY (NO_PROXY honoured; ~/.netrc credentials)"))
    ca_bundle: str | None = Field(default=None, description="CA certificates to trust instead of the system's "
                                  "(servers with a private CA)")
    client_cert: str | None = Field(default=None, description="client certificate presented to servers that ask "
                                    "for one (mutual TLS); may hold its private key too")
    client_key: str | None = Field(default=None, description="private key of client_cert, if in a separate file")

    @model_validator(mode="after")
    def _key_needs_cert(self) -> Connection:
        if self.client_key is not None and self.client_cert is None:
            raise ValueError("client_key is set without client_cert")
        return self


class RemotePool(PoolBase):
    type: Literal["remote"]
    urls: tuple[str, ...] = Field(min_length=1, description="base URLs of OpenAI-compatible servers")
    model: str = Field(description="model name sent to the remote servers")
    api_key_env: str | None = Field(default=None, description="environment variable holding the API key")
    provider: str | None = Field(default=None, pattern=r"^[a-z0-9_.]+$", description=(
        "the provider named on this pool's trace spans (gen_ai.provider.name, OpenTelemetry GenAI conventions: "
        "openai, azure.ai.openai, anthropic, aws.bedrock, vllm, ...); unset: the well-known API its first URL's "
        "host names, else openai (policies.providers)"))
    responses: Literal["native", "chat"] = Field(default="native", description=(
        "how /v1/responses reaches the servers: native (they serve /v1/responses, as vLLM does) or chat (they "
        "speak chat completions only: the gateway translates, statelessly; gateway.serving.sending.responses_chat)"))
    health_path: str = Field(default="/health", pattern=r"^/", description=(
        "path probed (with the API key) to decide a replica is up: vLLM serves /health; for other "
        "OpenAI-compatible APIs use /v1/models"))
    connection: Connection = Field(default_factory=Connection, description="proxy and TLS: CA bundle, client "
                                   "certificate")
    tokenizer: str | None = Field(default=None, description=(
        "a Hugging Face tokenizer directory on the gateway's machine (with the model's chat template), to count "
        "the tokens of answers the servers did not count (a client that left mid-stream); without one they are "
        "estimated (4 characters a token) and recorded as usage_source: estimate. Prompts are never sent to the "
        "servers again to be counted"))
    context_tokens: int | None = Field(default=None, ge=64, description=(
        "the servers' context window (prompt and completion together, in tokens): a request that does not fit "
        "goes to the other tier or gets a 400 (gateway.serving.routing.context_fit); unset: not checked here"))
    required_for_ready: bool = Field(default=False, description=(
        "the gateway is not ready (/readyz 503) while this pool has no ready replica; default: no (a cloud "
        "outage must not take every gateway out of service). An optional pool that is down is reported as "
        "degraded in /readyz"))

    @property
    def needed_for_ready(self) -> bool:
        """Whether /readyz fails while this pool is down."""
        return self.required_for_ready



Pool = Annotated[LocalPool | RemotePool, Field(discriminator="type")]


def is_embedding(spec: LocalPool | RemotePool) -> bool:
    """Whether the pool serves /v1/embeddings (`kind: embedding`) rather than the generative endpoints."""
    return spec.kind == "embedding"


def context_of(spec: LocalPool | RemotePool) -> int | None:
    """The tokens a pool's engines hold (prompt and completion together); None where the policy does not say."""
    return spec.engine.max_model_len if isinstance(spec, LocalPool) else spec.context_tokens


def engine_version(engine: EngineSpec) -> str:
    """A short, stable name of an engine version: 8 hex digits of the hash of its whole spec. Equal specs have
    equal versions in every process and build; metrics, cost records and answers carry it."""
    text = json.dumps(engine.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def pool_version(spec: LocalPool | RemotePool) -> str:
    """The version of a pool's serving (not canary) engines: `engine_version`, or for a remote pool the hash of
    the model and URLs it calls."""
    if isinstance(spec, LocalPool):
        return engine_version(spec.engine)
    text = json.dumps({"model": spec.model, "urls": list(spec.urls)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def as_remote_pool(raw: Mapping[str, Any], urls: Sequence[str]) -> dict[str, Any]:
    """A local pool's policy entry (`raw`, as written) as a remote pool on `urls`: its engine moved to containers
    or pods of its own (`cascade-image gateway --engine`, `cascade deploy render`). It serves the engine's
    `served_name` at the same price, keeps what the gateway itself does with the pool (its description, breaker,
    replica choice, output checks, placement on the pool map and expected completion tokens, as written), checks
    the context window against the engine's `max_model_len` (`context_tokens`), and /readyz still needs it as it
    needed the local pool (`LocalPool.needed_for_ready`). Raises pydantic's ValidationError for an invalid local
    pool."""
    spec = LocalPool.model_validate(raw)
    remote = {"type": "remote", "price": raw["price"], "urls": list(urls), "model": spec.engine.served_name,
              "description": raw.get("description", ""), "required_for_ready": spec.needed_for_ready,
              "context_tokens": spec.engine.max_model_len}
    return remote | {key: raw[key] for key in _KEPT_AS_REMOTE if key in raw}


# the keys of a local pool that mean the same on a remote one (the gateway's side of the pool, not its engine's)
_KEPT_AS_REMOTE = ("kind", "breaker", "replica_choice", "output_checks", "placement", "expected_completion_tokens")
