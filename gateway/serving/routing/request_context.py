"""What one request is routed and sent under: the same for every step that plans it and every layer that sends it.

`RequestContext` is frozen: a step changes the request's decision (`policies.decide.RouteDecision`), never its
context. Admission is the one thing that completes it (`downgrade`), before the first route step runs
(`gateway.serving.steps`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.serving.openai.endpoints import Endpoint, NativeBody, endpoint_of
from gateway.serving.openai.schema import ChatRequest
from gateway.tenancy.api_keys import ApiKey
from policies.ladder import LadderState
from policies.loader import LoadedPolicy

__all__ = ["BatchTag", "RequestContext"]


@dataclass(frozen=True, slots=True)
class BatchTag:
    """A request that is one line of a batch (`gateway.batches`): its batch's id and the line's `custom_id`. It is
    sent in the batch lane (`ServingParts.lane`), priced at the batch discount and recorded with both."""

    batch_id: str
    custom_id: str


@dataclass(frozen=True, slots=True)
class RequestContext:
    """`request` and `raw`: the request's routing view (for a Responses or completions request, the view of
    `native`, its own body: `gateway.serving.openai.endpoints`); `loaded`: the policy it is served under (read once);
    `ladder`: the degradation ladder's state when it arrived; `downgrade`: whether the tenant's budget downgrades it
    (set by admission); `headers`: the client's request headers; `key`: the caller's API key (None: no keys);
    `started` (monotonic) and `started_wall` (UTC epoch): its arrival, in seconds; `batch`: the batch line it is
    (None: an interactive request)."""

    request: ChatRequest
    raw: dict[str, Any]
    tenant: str
    request_id: str
    loaded: LoadedPolicy
    ladder: LadderState
    native: NativeBody | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    key: ApiKey | None = None
    downgrade: bool = False
    started: float = 0.0
    started_wall: float = 0.0
    batch: BatchTag | None = None

    @property
    def endpoint(self) -> Endpoint:
        """The endpoint asked (its capabilities say what the path does for it)."""
        return endpoint_of(self.native)
