"""Render the Kubernetes manifests of a deployment from one values file (`gateway.deploy.k8s_values`) and the
policy it names. Pure: builds plain dicts, touches no cluster.

What comes out (names prefixed with `values.name`):

- a ConfigMap with the gateway's policy: the named policy with each `local` pool turned into a `remote` pool
  whose URLs are that pool's engine pods (one StatefulSet per pool behind a headless Service, so the gateway
  still sees every replica and keeps its load-aware choice);
- per local pool, a vLLM StatefulSet (the engine arguments of `backends.engines.args.engine_command`, GPUs
  = tensor x pipeline parallel size, startup/readiness/liveness probes on `/health`, a model-cache PVC);
- Redis as a StatefulSet with an append-only file on a PVC, and its Service;
- the gateway Deployment (readiness `/readyz`, liveness `/healthz`, keys from a Secret ops create: required unless
  `gateway.secret_optional`), its Service, a PodDisruptionBudget and an autoscaling/v2 HPA on in-flight requests
  per pod.

Every container names an image a cluster can pull (`gateway.deploy.k8s_images`): the project's own, under the
registry they were pushed to, or the ones the values name; a local-only or unpinned tag fails the render.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml

from backends.engines.args import engine_command, engine_env
from gateway.deploy.k8s_autoscale import engine_hpa, pods_listed
from gateway.deploy.k8s_images import ENGINE_PACKAGES, check_images, engine_pod_image, gateway_pod_image
from gateway.deploy.k8s_values import Resources, Values, ValuesError, load_values
from policies.loader import PolicyError, load_policy, parse_policy
from policies.pools import as_remote_pool, engine_version
from policies.schema import LocalPool, Policy
from policies.speculative import DraftSpeculation

__all__ = ["Manifest", "cluster_policy", "engine_name", "gpus_per_pod", "render", "render_file",
           "to_yaml"]

Manifest = dict[str, Any]
POLICY_DIR = "/etc/cascade"
STATE_DIR = "/var/lib/cascade"
_DEMO = "demo:"
_OFFLINE = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
_IMAGE_USER = 10001  # the project image's user (deploy/Dockerfile): owns the volumes it writes


def _dns(text: str) -> str:
    """A DNS-1123 label from a pool name (lower case, '-' for anything else)."""
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")


def engine_name(values: Values, pool: str, spec: LocalPool) -> str:
    """Name of a pool's StatefulSet and of its headless Service: with the engine version
    (`policies.pools.engine_version`), so that a changed engine block is a new StatefulSet that `kubectl apply`
    starts beside the old one. The gateway keeps routing to the old pods until the new ones answer (its policy
    watcher tries the change again until they do), then the old StatefulSet can be deleted: blue-green
    (docs/deploy.md)."""
    return f"{values.name}-engine-{_dns(pool)}-{engine_version(spec.engine)}"


def _labels(values: Values, component: str, **extra: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": values.name, "app.kubernetes.io/component": component, **extra}


def _meta(values: Values, name: str, labels: dict[str, str], **more: Any) -> dict[str, Any]:
    return {"name": name, "namespace": values.namespace, "labels": labels, **more}


def _resources(res: Resources) -> dict[str, Any]:
    return {k: v for k, v in (("requests", res.requests), ("limits", res.limits)) if v}


def _http_probe(path: str, port: int, period: int, failures: int, timeout: int = 5) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": port}, "periodSeconds": period, "failureThreshold": failures,
            "timeoutSeconds": timeout}


def _pool_urls(values: Values, pool: str, spec: LocalPool, replicas: int) -> list[str]:
    svc = engine_name(values, pool, spec)
    host = f"{svc}.{values.namespace}.svc.cluster.local"
    return [f"http://{svc}-{i}.{host}:{values.engines.port}" for i in range(replicas)]


def cluster_policy(values: Values, raw: dict[str, Any], policy: Policy) -> dict[str, Any]:
    """The policy as the gateway in the cluster reads it: local pools become remote pools on their pods."""
    pools = dict(raw["pools"])
    for name, spec in policy.pools.items():
        if isinstance(spec, LocalPool):
            pools[name] = as_remote_pool(raw["pools"][name], _pool_urls(values, name, spec, pods_listed(spec)))
    return {**raw, "pools": pools}


def _engine_args(values: Values, pool: str, spec: LocalPool) -> list[str]:
    draft = spec.engine.speculative
    for model in (spec.engine.model, draft.model if isinstance(draft, DraftSpeculation) else ""):
        if model.startswith(_DEMO):
            raise ValuesError(f"pool {pool!r}: {model!r} is a demo model built on the local machine; a cluster "
                              "needs a hub id or a path in the image (use a policy like policies/gpu.yaml)")
    argv = engine_command(spec.engine, values.engines.port)
    args = argv[argv.index("vllm.entrypoints.openai.api_server") + 1:]
    args[args.index("--host") + 1] = "0.0.0.0"  # a pod listens on its own interface
    return args


def _on_gpus(values: Values) -> bool:
    return values.images.engine_variant == "cuda"


def _engine_resources(values: Values, pool: str, gpus: int) -> dict[str, Any]:
    """A replica's resources: the pool's override, else per GPU; GPUs only for the cuda variant."""
    override = values.engines.pools.get(pool)
    if override is not None and override.resources is not None:
        res = _resources(override.resources)
        if _on_gpus(values):
            res.setdefault("limits", {})["nvidia.com/gpu"] = str(gpus)
        return res
    cpu, mem = values.engines.cpu_per_gpu * gpus, values.engines.memory_gib_per_gpu * gpus
    gpu = {"nvidia.com/gpu": str(gpus)} if _on_gpus(values) else {}
    return {"requests": {"cpu": str(cpu), "memory": f"{mem}Gi", **gpu}, "limits": {"memory": f"{mem}Gi", **gpu}}


def _engine_env(values: Values, spec: LocalPool) -> list[dict[str, Any]]:
    # the supervisor's variables (KV space, Ray address, the policy's env), but a cluster downloads models: the
    # image is built offline (HF_HUB_OFFLINE=1), so online unless the policy's env says otherwise
    env = {k: v for k, v in engine_env(spec.engine).items() if k not in _OFFLINE or k in spec.engine.env}
    online = {k: "0" for k in _OFFLINE if k not in env}
    items: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in ({"HF_HOME": "/models"} | online | env).items()]
    if values.engines.hf_token_key is None:
        return items
    return [*items, _secret_env(values, "HF_TOKEN", values.engines.hf_token_key)]


def _secret_env(values: Values, name: str, key: str) -> dict[str, Any]:
    """`name` from the Secret's `key`: required (a missing one stops the pod) unless `gateway.secret_optional`."""
    ref = {"name": values.gateway.secret_name, "key": key, "optional": values.gateway.secret_optional}
    return {"name": name, "valueFrom": {"secretKeyRef": ref}}


def gpus_per_pod(spec: LocalPool) -> int:
    """GPUs of one engine pod: the whole replica (TP x PP x DP) on one node; for a replica spanning nodes
    (Ray), the head node's share (`gpus_per_node`); the other nodes are the Ray cluster's workers."""
    e = spec.engine
    whole = e.tensor_parallel_size * e.pipeline_parallel_size * e.data_parallel_size
    return e.gpus_per_node if e.nodes > 1 and e.gpus_per_node else whole


def _engine(values: Values, pool: str, spec: LocalPool) -> list[Manifest]:
    name, eng = engine_name(values, pool, spec), values.engines
    gpus = gpus_per_pod(spec)
    labels = _labels(values, "engine", **{"cascade/pool": _dns(pool), "cascade/version": engine_version(spec.engine)})
    container = {
        "name": "vllm", "image": engine_pod_image(values), "imagePullPolicy": eng.image_pull_policy,
        "command": ["python3", "-m", "vllm.entrypoints.openai.api_server"], "args": _engine_args(values, pool, spec),
        "env": _engine_env(values, spec), "ports": [{"name": "http", "containerPort": eng.port}],
        "resources": _engine_resources(values, pool, gpus),
        "startupProbe": _http_probe("/health", eng.port, 10, max(1, math.ceil(spec.engine.startup_timeout_s / 10))),
        "readinessProbe": _http_probe("/health", eng.port, 5, 3),
        "livenessProbe": _http_probe("/health", eng.port, 15, 4),
        "volumeMounts": [{"name": "models", "mountPath": "/models"}, {"name": "shm", "mountPath": "/dev/shm"}],
    }
    override = eng.pools.get(pool)
    pod_spec: dict[str, Any] = {
        "containers": [container],
        # the image runs as its own user; the model cache's volume is made writable for it
        "securityContext": {"runAsNonRoot": True, "runAsUser": _IMAGE_USER, "fsGroup": _IMAGE_USER},
        "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": eng.shm_size}}],
    }
    if _on_gpus(values):
        pod_spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    if override is not None and override.node_selector:
        pod_spec["nodeSelector"] = dict(override.node_selector)
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": _meta(values, name, labels),
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": False, "selector": labels,
                 "ports": [{"name": "http", "port": eng.port, "targetPort": "http"}]},
    }
    sts = {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": _meta(values, name, labels, annotations=_engine_annotations(values, spec)),
        "spec": {"serviceName": name, "replicas": spec.engine.replicas, "podManagementPolicy": "Parallel",
                 "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": pod_spec},
                 "volumeClaimTemplates": [_claim("models", eng.model_cache, eng.storage_class)]},
    }
    hpa = engine_hpa(name, _meta(values, name, labels), spec)
    return [service, sts] if hpa is None else [service, sts, hpa]


def _engine_annotations(values: Values, spec: LocalPool) -> dict[str, str]:
    notes = {"cascade/description": spec.description}
    if values.engines.image is None:  # the project's own image: the engine it pins
        notes["cascade/engine-package"] = ENGINE_PACKAGES[values.images.engine_variant]
    return notes


def _claim(name: str, size: str, storage_class: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}
    if storage_class:
        spec["storageClassName"] = storage_class
    return {"metadata": {"name": name}, "spec": spec}


def _redis(values: Values) -> list[Manifest]:
    r, name = values.redis, f"{values.name}-redis"
    labels = _labels(values, "redis")
    probe = {"tcpSocket": {"port": r.port}, "periodSeconds": 10, "failureThreshold": 3}
    container = {
        "name": "redis", "image": r.image,
        "args": ["redis-server", "--port", str(r.port), "--appendonly", "yes", "--appendfsync", "always",
                 "--dir", "/data"],
        "ports": [{"name": "redis", "containerPort": r.port}], "resources": _resources(r.resources),
        "readinessProbe": probe, "livenessProbe": probe, "volumeMounts": [{"name": "data", "mountPath": "/data"}],
    }
    return [
        {"apiVersion": "v1", "kind": "Service", "metadata": _meta(values, name, labels),
         "spec": {"selector": labels, "ports": [{"name": "redis", "port": r.port, "targetPort": "redis"}]}},
        {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": _meta(values, name, labels),
         "spec": {"serviceName": name, "replicas": 1, "selector": {"matchLabels": labels},
                  "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}},
                  "volumeClaimTemplates": [_claim("data", r.storage, r.storage_class)]}},
    ]


def _gateway_env(values: Values, policy: Policy) -> list[dict[str, Any]]:
    redis_url = f"redis://{values.name}-redis.{values.namespace}.svc.cluster.local:{values.redis.port}/0"
    env: list[dict[str, Any]] = [{"name": "CASCADE_REDIS_URL", "value": redis_url},
                                 {"name": "CASCADE_HOME", "value": STATE_DIR}]
    keys = ["CASCADE_ADMIN_KEY", *sorted({p.api_key_env for p in policy.pools.values()
                                          if not isinstance(p, LocalPool) and p.api_key_env})]
    return env + [_secret_env(values, key, key) for key in keys]


def _gateway_deployment(values: Values, policy: Policy, labels: dict[str, str]) -> Manifest:
    g = values.gateway
    args = ["serve", "--policy", f"{POLICY_DIR}/policy.yaml", "--host", "0.0.0.0", "--port", str(g.port),
            "--no-engines", "--scorer", g.scorer, "--log-level", g.log_level, "--log-format", "json"]
    container = {
        "name": "gateway", "image": gateway_pod_image(values), "imagePullPolicy": g.image_pull_policy,
        "command": ["cascade"],
        "args": args, "env": _gateway_env(values, policy), "ports": [{"name": "http", "containerPort": g.port}],
        "resources": _resources(g.resources),
        "readinessProbe": _http_probe("/readyz", g.port, 5, 2),
        "livenessProbe": _http_probe("/healthz", g.port, 10, 3),
        "volumeMounts": [{"name": "policy", "mountPath": POLICY_DIR, "readOnly": True},
                         # the outbox only: the rest of the state folder holds what the image baked in
                         # (the router's embedder), which a volume over the whole folder would hide
                         {"name": "state", "mountPath": f"{STATE_DIR}/outbox"}],
    }
    annotations = {"prometheus.io/scrape": "true", "prometheus.io/port": str(g.port), "prometheus.io/path": "/metrics"}
    pod = {"metadata": {"labels": labels, "annotations": annotations},
           "spec": {"terminationGracePeriodSeconds": 40, "containers": [container],
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "fsGroup": 10001},
                    "volumes": [{"name": "policy", "configMap": {"name": f"{values.name}-policy"}},
                                {"name": "state", "emptyDir": {}}]}}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(values, f"{values.name}-gateway", labels),
            "spec": {"replicas": g.replicas, "selector": {"matchLabels": labels}, "template": pod,
                     "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}}}


def _gateway_hpa(values: Values, labels: dict[str, str]) -> Manifest:
    a, name = values.gateway.autoscaling, f"{values.name}-gateway"
    target = {"type": "AverageValue", "averageValue": str(a.in_flight_per_pod)}
    metrics: list[dict[str, Any]] = [{"type": "Pods", "pods": {"metric": {"name": a.metric_name}, "target": target}}]
    if a.cpu_utilization:
        metrics.append({"type": "Resource", "resource": {
            "name": "cpu", "target": {"type": "Utilization", "averageUtilization": a.cpu_utilization}}})
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": _meta(values, name, labels),
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
                     "minReplicas": a.min_replicas, "maxReplicas": max(a.max_replicas, a.min_replicas),
                     "metrics": metrics}}


def _gateway(values: Values, policy: Policy) -> list[Manifest]:
    labels, name = _labels(values, "gateway"), f"{values.name}-gateway"
    service = {"apiVersion": "v1", "kind": "Service", "metadata": _meta(values, name, labels),
               "spec": {"selector": labels, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}
    pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": _meta(values, name, labels),
           "spec": {"minAvailable": 1, "selector": {"matchLabels": labels}}}
    return [service, _gateway_deployment(values, policy, labels), _gateway_hpa(values, labels), pdb]


def render(values: Values, policy_path: Path, *, warn: Callable[[str], None] | None = None,
           other_policy: bool = False) -> list[Manifest]:
    """All manifests, in apply order; `warn` takes each warning. Raises ValuesError (also for a policy that does not
    load). `engines.pools` naming a pool that is not a local pool of the policy is an error, or, with
    `other_policy` (a policy given instead of the values file's own) and `warn`, a warning and the entry is left
    out."""
    try:
        loaded = load_policy(policy_path)
        raw = yaml.safe_load(policy_path.read_text(encoding="utf-8"))
        derived = cluster_policy(values, raw, loaded.policy)
        parse_policy(yaml.safe_dump(derived, sort_keys=False), source=f"{policy_path} (cluster form)")
    except PolicyError as exc:
        raise ValuesError(str(exc)) from exc
    values = _known_pool_overrides(values, loaded.policy, policy_path, warn if other_policy else None)
    files = _placement_files(derived, policy_path)
    labels = _labels(values, "policy")
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(values, f"{values.name}-policy", labels),
              "data": {"policy.yaml": yaml.safe_dump(derived, sort_keys=False), **files}}
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": values.namespace}}
    engines = [m for name, spec in loaded.policy.pools.items() if isinstance(spec, LocalPool)
               for m in _engine(values, name, spec)]
    manifests = [namespace, config, *_redis(values), *engines, *_gateway(values, loaded.policy)]
    check_images(values, manifests, warn)
    return manifests


def _placement_files(derived: dict[str, Any], policy_path: Path) -> dict[str, str]:
    """The placement files the policy's tiers name (relative to the policy's folder), as ConfigMap entries beside
    policy.yaml: each pool's `placement:` in `derived` becomes the file's bare name (mounted in the same folder)."""
    files: dict[str, str] = {}
    for name, pool in list(derived["pools"].items()):
        value = pool.get("placement")
        if not isinstance(value, str) or not value.endswith(".json"):
            continue  # a shared source's model name: nothing to ship
        key, path = Path(value).name, policy_path.parent / value
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ValuesError(f"pool {name!r}: cannot read its placement file {path}: {exc}") from exc
        if files.get(key, text) != text or key == "policy.yaml":
            raise ValuesError(f"pool {name!r}: its placement file {value!r} has the name of another file of the "
                              "policy ConfigMap; give each placement file a name of its own")
        files[key] = text
        derived["pools"][name] = {**pool, "placement": key}
    return files


def _known_pool_overrides(values: Values, policy: Policy, policy_path: Path,
                          warn: Callable[[str], None] | None) -> Values:
    local = [name for name, spec in policy.pools.items() if isinstance(spec, LocalPool)]
    if not (unknown := sorted(set(values.engines.pools) - set(local))):
        return values
    problem = (f"engines.pools names {unknown}, which are not local pools of {policy_path} (its local pools: "
               f"{', '.join(local) or 'none'})")
    if warn is None:
        raise ValuesError(f"{problem}: remove them from the values file or name this policy's pools there")
    warn(f"{problem}: left out (they set the values file's own policy's engines)")
    kept = {name: spec for name, spec in values.engines.pools.items() if name in local}
    return values.model_copy(update={"engines": values.engines.model_copy(update={"pools": kept})})


def render_file(values_path: Path, *, policy: Path | None = None, registry: str | None = None,
                allow_local: bool = False, warn: Callable[[str], None] | None = None) -> list[Manifest]:
    """Load the values file (and the policy it names, or `policy`) and render, with `registry` as
    `images.registry` when given and `allow_local` setting `images.allow_local`. `warn` takes each warning; with
    `policy`, also what the values file sets for pools that policy does not run locally (else an error). Raises
    ValuesError."""
    values, policy_path = load_values(values_path, policy=policy, registry=registry, allow_local=allow_local)
    return render(values, policy_path, warn=warn, other_policy=policy is not None)


class _PlainDumper(yaml.SafeDumper):
    """No anchors/aliases: label dicts are shared between objects, and kubectl users read the output."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None  # the policy in the ConfigMap stays readable
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_PlainDumper.add_representer(str, _str)


def to_yaml(manifests: Iterable[Manifest]) -> str:
    """One multi-document YAML stream, as `kubectl apply -f -` takes it."""
    return yaml.dump_all(list(manifests), Dumper=_PlainDumper, sort_keys=False, default_flow_style=False)
