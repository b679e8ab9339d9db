"""Pools: where a request can go. `local` pools are engines the gateway's supervisor starts; `remote` pools
are OpenAI-compatible servers someone else runs (other hosts, or a cloud endpoint for overflow)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from policies.frozen import Frozen
from policies.money import Price

__all__ = ["EngineSpec", "LocalPool", "Pool", "RemotePool"]


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
    speculative_config: dict[str, Any] | None = Field(default=None, description="vLLM --speculative-config")
    tensor_parallel_size: int = Field(default=1, ge=1)
    pipeline_parallel_size: int = Field(default=1, ge=1)
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    base_port: int = Field(default=8100, ge=1024, le=65000)
    startup_timeout_s: float = Field(default=600, gt=0)


class LocalPool(Frozen):
    type: Literal["local"]
    price: Price
    engine: EngineSpec
    description: str = ""


class RemotePool(Frozen):
    type: Literal["remote"]
    price: Price
    urls: tuple[str, ...] = Field(min_length=1, description="base URLs of OpenAI-compatible servers")
    model: str = Field(description="model name sent to the remote servers")
    api_key_env: str | None = Field(default=None, description="environment variable holding the API key")
    description: str = ""


Pool = Annotated[LocalPool | RemotePool, Field(discriminator="type")]
