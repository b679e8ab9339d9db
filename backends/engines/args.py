"""How a policy's engine spec becomes a vLLM server's argv and environment. Pure: builds nothing, starts nothing.

The supervisor runs these commands; `cascade policy explain` prints them and `cascade deploy render` puts them in
Kubernetes manifests, so the three cannot disagree.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from backends.models.demo import demo_model_dir, models_root
from policies.schema import EngineSpec

__all__ = ["DEMO_PREFIX", "engine_command", "engine_env", "resolve_model"]

DEMO_PREFIX = "demo:"


def resolve_model(spec: EngineSpec, models_dir: Path | None = None) -> str:
    """The ``--model`` argument: ``demo:NAME`` becomes that demo model's directory (not built here)."""
    if spec.model.startswith(DEMO_PREFIX):
        root = models_root() if models_dir is None else models_dir
        return str(demo_model_dir(root, spec.model.removeprefix(DEMO_PREFIX)))
    return spec.model


def engine_command(spec: EngineSpec, port: int, models_dir: Path | None = None) -> list[str]:
    """The argv of one replica listening on 127.0.0.1:``port``. Pure (does not build demo models)."""
    spec_json = None if spec.speculative_config is None else json.dumps(spec.speculative_config, sort_keys=True)
    options: list[tuple[str, object]] = [
        ("--model", resolve_model(spec, models_dir)),
        ("--served-model-name", spec.served_name),
        ("--host", "127.0.0.1"),
        ("--port", port),
        ("--max-model-len", spec.max_model_len),
        ("--dtype", spec.dtype),
        ("--quantization", spec.quantization),
        ("--gpu-memory-utilization", spec.gpu_memory_utilization),
        ("--speculative-config", spec_json),
        ("--tensor-parallel-size", spec.tensor_parallel_size if spec.tensor_parallel_size != 1 else None),
        ("--pipeline-parallel-size", spec.pipeline_parallel_size if spec.pipeline_parallel_size != 1 else None),
        ("--data-parallel-size", spec.data_parallel_size if spec.data_parallel_size != 1 else None),
        ("--distributed-executor-backend", spec.distributed_executor_backend),
    ]
    args = [part for flag, value in options if value is not None for part in (flag, str(value))]
    if spec.enable_expert_parallel:
        args.append("--enable-expert-parallel")
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *args, *spec.extra_args]


def engine_env(spec: EngineSpec) -> dict[str, str]:
    """Variables set for a replica on top of the inherited environment (``spec.env`` wins)."""
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    if spec.kv_cache_space_gib is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(spec.kv_cache_space_gib)
    if spec.ray is not None:
        env["RAY_ADDRESS"] = spec.ray.address
        if spec.ray.namespace is not None:
            env["RAY_NAMESPACE"] = spec.ray.namespace
    return env | dict(spec.env)
