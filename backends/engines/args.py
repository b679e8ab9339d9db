"""How a policy's engine spec becomes a vLLM server's argv and environment. Pure: builds nothing, starts nothing.

The supervisor runs these commands; `cascade policy explain` prints them and `cascade deploy render` puts them in
Kubernetes manifests, so the three cannot disagree.

Traces: where the gateway exports OTLP traces (the standard `OTEL_*` variables, `otlp_traces_endpoint`), the
supervisor starts its engines with vLLM's own export to the same endpoint (`tracing_args`, `engine_env`'s
`traces_to`), so that the span vLLM writes per request joins the trace whose `traceparent` the gateway sends it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from backends.models.demo import demo_model_dir, models_root
from policies.schema import EngineSpec
from policies.speculative import NgramSpeculation, Speculation

__all__ = ["DEMO_PREFIX", "engine_command", "engine_env", "otlp_traces_endpoint", "resolve_model", "speculative_config",
           "tracing_args"]

DEMO_PREFIX = "demo:"


def resolve_model(spec: EngineSpec, models_dir: Path | None = None) -> str:
    """The ``--model`` argument: ``demo:NAME`` becomes that demo model's directory (not built here)."""
    return _model_path(spec.model, models_dir)


def _model_path(model: str, models_dir: Path | None) -> str:
    if model.startswith(DEMO_PREFIX):
        root = models_root() if models_dir is None else models_dir
        return str(demo_model_dir(root, model.removeprefix(DEMO_PREFIX)))
    return model


def speculative_config(speculation: Speculation, models_dir: Path | None = None) -> dict[str, Any]:
    """vLLM's ``--speculative-config`` for a pool's ``speculative`` block (a draft's ``demo:NAME`` becomes its
    directory, not built here). Every field is written out, so vLLM's own defaults never decide."""
    config: dict[str, Any] = {"num_speculative_tokens": speculation.num_speculative_tokens}
    if isinstance(speculation, NgramSpeculation):
        return config | {"method": "ngram", "prompt_lookup_min": speculation.prompt_lookup_min,
                         "prompt_lookup_max": speculation.prompt_lookup_max}
    return config | {"method": "draft_model", "model": _model_path(speculation.model, models_dir)}


def engine_command(spec: EngineSpec, port: int, models_dir: Path | None = None) -> list[str]:
    """The argv of one replica listening on 127.0.0.1:``port``. Pure (does not build demo models)."""
    spec_json = None if spec.speculative is None else json.dumps(
        speculative_config(spec.speculative, models_dir), sort_keys=True)
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
    if spec.tool_calling is not None:
        args += ["--enable-auto-tool-choice", "--tool-call-parser", spec.tool_calling.parser]
        if spec.tool_calling.chat_template is not None:
            args += ["--chat-template", spec.tool_calling.chat_template]
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *args, *spec.extra_args]


def otlp_traces_endpoint(env: Mapping[str, str]) -> str | None:
    """The OTLP/HTTP URL the standard variables send spans to, as the OpenTelemetry SDK reads them:
    ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` as it is, else ``OTEL_EXPORTER_OTLP_ENDPOINT`` + ``/v1/traces``; None
    when neither is set or ``OTEL_SDK_DISABLED`` is true (tracing off)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if traces := env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return traces
    base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    return base.rstrip("/") + "/v1/traces" if base else None


def tracing_args(spec: EngineSpec, traces_to: str | None) -> list[str]:
    """vLLM's own OTLP export of its request spans to ``traces_to`` (None: none); nothing where the spec's
    ``extra_args`` say it already."""
    if traces_to is None or any(a.split("=", 1)[0] == "--otlp-traces-endpoint" for a in spec.extra_args):
        return []
    return ["--otlp-traces-endpoint", traces_to]


def engine_env(spec: EngineSpec, traces_to: str | None = None) -> dict[str, str]:
    """Variables set for a replica on top of the inherited environment (``spec.env`` wins). ``traces_to``: the
    engine exports spans there (`tracing_args`): over OTLP/HTTP, the protocol of that endpoint (vLLM's default is
    gRPC), as service ``vllm-<served name>`` (not the gateway's ``OTEL_SERVICE_NAME``, which it inherits)."""
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    if traces_to is not None:
        env |= {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf", "OTEL_SERVICE_NAME": f"vllm-{spec.served_name}"}
    if spec.kv_cache_space_gib is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(spec.kv_cache_space_gib)
    if spec.ray is not None:
        env["RAY_ADDRESS"] = spec.ray.address
        if spec.ray.namespace is not None:
            env["RAY_NAMESPACE"] = spec.ray.namespace
    return env | dict(spec.env)
