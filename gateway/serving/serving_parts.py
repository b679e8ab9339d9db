"""The collaborators the request path shares: what the composition root (`gateway.api.runtime`) hands the chat
service, which builds its route steps and sending layers from them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from gateway.caching.answer_cache import AnswerCache
from gateway.control.adaptation.degradation import DegradationMonitor
from gateway.control.fleet.on_demand import Wake
from gateway.serving.routing.context_fit import ContextFit
from gateway.serving.routing.router import RequestRouter
from gateway.serving.routing.versions import PoolVersions
from gateway.serving.sending.forwarding import Forwarder
from gateway.telemetry.metrics import GatewayMetrics
from gateway.tenancy.admission import Admission
from policies.loader import LoadedPolicy

__all__ = ["Lane", "ServingParts"]


class Lane(Protocol):
    """The low-priority lane batch lines are sent in (`gateway.batches.lane`)."""

    async def enter(self, loaded: LoadedPolicy, pool: str, request_id: str) -> None:
        """Return once `pool` has room for one more batch line, holding it for `request_id` until the lane is told
        the line ended; raise a `GatewayError` (503) when none came in the policy's `batches.max_wait_s`."""

    async def arrived(self, loaded: LoadedPolicy, pool: str) -> None:
        """An interactive request was routed to `pool` (under `batches.preempt` it may take the pool back from the
        lines running on it, and returns once they are stopped)."""


@dataclass(frozen=True, slots=True)
class ServingParts:
    """Shared, not owned, by the request path. `versions` gives each routed request its pool's replicas (the pool's
    own, or its canary's). `wake(pool)` (scale to zero, `gateway.control.fleet.on_demand`) returns the pool that serves
    now. `cache` answers from, and keeps answers in, a tenant's response cache (`gateway.caching`). `fit` places a
    request by its length (`gateway.serving.routing.context_fit`; None: `versions`' pools, counted by the forwarder's
    engine client). `keep_requests`: keep each request's routing view on its facts (the replay log is on). `lane`: where
    batch lines wait for their pool's headroom once routed (None: they are sent like any request). `sleeping(pool)`:
    whether `pool` is scaled to zero now (a batch line does not wake it unless the policy's `batches.wake_on_demand`
    says so)."""

    versions: PoolVersions
    router: RequestRouter
    forwarder: Forwarder
    admission: Admission
    degradation: DegradationMonitor
    metrics: GatewayMetrics
    wake: Wake | None = None
    cache: AnswerCache | None = None
    fit: ContextFit | None = None
    keep_requests: bool = False
    lane: Lane | None = None
    sleeping: Callable[[str], bool] | None = None

    def context_fit(self) -> ContextFit:
        """`fit`, or the context-fit step over `versions`' pools."""
        return self.fit or ContextFit(self.forwarder.engines, self.versions.pool)
