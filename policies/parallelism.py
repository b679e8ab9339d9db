"""vLLM's own parallelism for one local engine replica, and scale-to-zero settings for a local pool.

A replica spans ``tensor_parallel_size x pipeline_parallel_size x data_parallel_size`` devices (its
"world"); expert parallelism reuses the TP x DP devices for the experts of a mixture-of-experts model.
More than one node needs Ray (``distributed_executor_backend: ray`` and a Ray address): the supervisor
starts the API server on this host, which joins the Ray cluster operators run on the other nodes.
`parallelism_problems` is the policy check; the command line itself is `backends.engines.args.engine_command`.
"""

from __future__ import annotations

from typing import Literal, Protocol

from pydantic import Field, field_validator

from policies.frozen import Frozen

__all__ = ["OnDemand", "ParallelFields", "RaySettings", "parallelism_problems"]


class RaySettings(Frozen):
    """Where the Ray cluster is (exported as RAY_ADDRESS / RAY_NAMESPACE to the engine)."""

    address: str = Field(description="Ray cluster address, e.g. 'ray://head:10001' or 'auto' on a Ray node")
    namespace: str | None = Field(default=None, description="Ray namespace for the engine's actors")


class ParallelFields(Protocol):
    """The engine-spec fields the parallelism check reads (`policies.pools.EngineSpec` has them)."""

    model: str
    tensor_parallel_size: int
    pipeline_parallel_size: int
    data_parallel_size: int
    enable_expert_parallel: bool
    moe: bool | None
    gpus_per_node: int | None
    nodes: int
    distributed_executor_backend: Literal["mp", "ray"] | None
    ray: RaySettings | None


def _is_moe(spec: ParallelFields) -> bool:
    return spec.moe if spec.moe is not None else spec.model == "demo:flagship"


def parallelism_problems(spec: ParallelFields) -> list[str]:
    """What is inconsistent in `spec`'s parallelism (empty when it can run); each message says the fix."""
    world = spec.tensor_parallel_size * spec.pipeline_parallel_size * spec.data_parallel_size
    shape = (f"tensor_parallel_size {spec.tensor_parallel_size} x pipeline_parallel_size "
             f"{spec.pipeline_parallel_size} x data_parallel_size {spec.data_parallel_size} = {world} devices")
    problems: list[str] = []
    if world > 1 and spec.gpus_per_node is None:
        problems.append(f"{shape}: declare gpus_per_node (and nodes) so the policy can check they fit")
    if spec.gpus_per_node is not None and world > spec.gpus_per_node * spec.nodes:
        problems.append(f"{shape} do not fit gpus_per_node {spec.gpus_per_node} x nodes {spec.nodes} = "
                        f"{spec.gpus_per_node * spec.nodes} GPUs; lower the parallel sizes or declare more GPUs")
    if spec.nodes > 1 and spec.distributed_executor_backend != "ray":
        problems.append(f"nodes {spec.nodes}: a replica across nodes needs distributed_executor_backend: ray")
    if spec.distributed_executor_backend == "ray" and spec.ray is None and spec.nodes > 1:
        problems.append("distributed_executor_backend ray across nodes needs `ray: {address: ...}` (the cluster)")
    if spec.ray is not None and spec.distributed_executor_backend != "ray":
        problems.append("`ray` settings are given but distributed_executor_backend is not ray; set it or drop them")
    if spec.enable_expert_parallel and not _is_moe(spec):
        problems.append("enable_expert_parallel is for mixture-of-experts models; set `moe: true` if this one is")
    if spec.enable_expert_parallel and spec.tensor_parallel_size * spec.data_parallel_size == 1:
        problems.append("enable_expert_parallel needs tensor_parallel_size x data_parallel_size > 1 "
                        "(the experts are spread over those devices)")
    return problems


class OnDemand(Frozen):
    """Scale to zero: the pool's engines start on the first request that needs them, stop when idle."""

    idle_stop_after_s: float = Field(gt=0, description="stop the engines after this long without a request")
    cold_start_timeout_s: float = Field(gt=0, description="how long a request waits for a cold start")
    on_cold: str = Field(default="wait", description="'wait' (up to cold_start_timeout_s, then 503 with "
                         "Retry-After) or 'fallback:<pool>' (serve from that pool while the engines start)")

    @field_validator("on_cold")
    @classmethod
    def _on_cold_form(cls, value: str) -> str:
        if value != "wait" and not (value.startswith("fallback:") and value.removeprefix("fallback:")):
            raise ValueError(f"on_cold must be 'wait' or 'fallback:<pool>', got {value!r}")
        return value

    @property
    def fallback_pool(self) -> str | None:
        """The pool that serves while this one is cold, or None to wait."""
        return self.on_cold.removeprefix("fallback:") if self.on_cold.startswith("fallback:") else None
