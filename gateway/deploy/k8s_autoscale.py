"""An engine StatefulSet's autoscaler in Kubernetes, from the pool's `autoscale:` (`policies.autoscale`): an
autoscaling/v2 HorizontalPodAutoscaler on the engine pods' own vLLM metrics, through the Prometheus adapter.

The cluster's autoscaler is Kubernetes', not the gateway's: the gateway's `autoscale` loop runs only where it starts
the engines itself. The same bounds apply, with two differences an HPA imposes:
- it keeps an average per pod under a target, so `queue_depth` (summed over replicas in the policy) and
  `kv_cache_usage` become per-pod targets (`vllm_num_requests_waiting`, `vllm_kv_cache_usage_perc`: the adapter
  rule must expose vLLM's `vllm:` metrics under these names, docs/deploy.md);
- `in_flight` and `ttft_p95_s` are the gateway's figures, not the pods': they are not rendered (a pool that has only
  those gets no HPA).
`sustained_s` is the scale-up stabilization window, `scale_down_after_idle_s` the scale-down one, and one pod is
added or removed per `cooldown_s`. The gateway's policy lists a URL for every pod up to `max_replicas`, so that it
routes to a pod as soon as the HPA's new pod is ready (a pod that does not exist just fails its probe).
"""

from __future__ import annotations

import math
from typing import Any

from policies.schema import LocalPool

__all__ = ["POD_METRICS", "engine_hpa", "pods_listed"]

POD_METRICS = {"queue_depth": "vllm_num_requests_waiting", "kv_cache_usage": "vllm_kv_cache_usage_perc"}
"""Policy signal -> the per-pod metric the Prometheus adapter serves for it."""


def pods_listed(spec: LocalPool) -> int:
    """How many engine pods the gateway's policy names: every one the HPA may run."""
    scale = spec.autoscale
    return max(spec.engine.replicas, scale.max_replicas if scale is not None else 0)


def engine_hpa(statefulset: str, metadata: dict[str, Any], spec: LocalPool) -> dict[str, Any] | None:
    """The HPA of a pool's engine StatefulSet, or None when it does not autoscale or watches no pod metric."""
    scale = spec.autoscale
    if scale is None:
        return None
    bounds = scale.scale_up.bounds()
    metrics = [{"type": "Pods", "pods": {"metric": {"name": POD_METRICS[signal]},
                                         "target": {"type": "AverageValue", "averageValue": f"{bounds[signal]:g}"}}}
               for signal in POD_METRICS if signal in bounds]
    if not metrics:
        return None
    period = max(1, math.ceil(scale.cooldown_s)) if scale.cooldown_s else 15
    one_pod = [{"type": "Pods", "value": 1, "periodSeconds": min(period, 1800)}]
    behavior = {
        "scaleUp": {"stabilizationWindowSeconds": min(3600, math.ceil(scale.scale_up.sustained_s)),
                    "policies": one_pod},
        "scaleDown": {"stabilizationWindowSeconds": min(3600, math.ceil(scale.scale_down_after_idle_s)),
                      "policies": one_pod},
    }
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": metadata,
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": statefulset},
                     "minReplicas": scale.min_replicas, "maxReplicas": scale.max_replicas, "metrics": metrics,
                     "behavior": behavior}}
