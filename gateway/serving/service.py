"""The chat-completions service: screen → plan (`gateway.serving.steps`) → send (`gateway.serving.sending.layers`).

HTTP-free: it takes a validated `ChatRequest` and returns a reply for `gateway.api.app` to render. The request's
path, top to bottom: the tenant's input guards; admission, the first route, each route step and the first call's
engine body (`Planner`); then the sending layers, cache, output check, failover, canary, cascade, dispatch
(`sending_stack`), each wrapping the next.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gateway.control.policy.policy_holder import PolicyHolder
from gateway.errors import BadRequest
from gateway.guards.screen import InputGuard
from gateway.learning.loop import LearningTap
from gateway.serving.openai.endpoints import NativeBody
from gateway.serving.openai.schema import ChatRequest
from gateway.serving.routing.completion_limit import CompletionLimits
from gateway.serving.routing.request_context import BatchTag, RequestContext
from gateway.serving.sending.calls import Calls
from gateway.serving.sending.forwarding import JSONReply, StreamReply
from gateway.serving.sending.layers import sending_stack
from gateway.serving.serving_parts import ServingParts
from gateway.serving.steps import Planner
from gateway.tenancy.api_keys import ApiKey

__all__ = ["ChatService", "JSONReply", "ServingParts", "StreamReply"]


class ChatService:
    """Handles one chat request end to end. Shares, but does not own, its collaborators (`ServingParts`).
    `learning` sees every answered request of the endpoints it learns from (policy `learning:`)."""

    def __init__(self, policies: PolicyHolder, parts: ServingParts, learning: LearningTap | None = None) -> None:
        parts = replace(parts, fit=parts.context_fit())  # one context-fit step for planning, limits and failover
        self._policies = policies
        self._parts = parts
        self._learning = learning
        self._guard = InputGuard(parts.metrics.guard_decision)
        assert parts.fit is not None
        calls = Calls(CompletionLimits(parts.fit), parts.admission)
        self._planner = Planner(parts, calls)
        self._layers = sending_stack(parts, calls)

    async def handle(self, request: ChatRequest, raw: dict[str, Any], tenant: str, request_id: str,
                     headers: Mapping[str, str] | None = None, native: NativeBody | None = None,
                     key: ApiKey | None = None, batch: BatchTag | None = None) -> JSONReply | StreamReply:
        """`native`: the body of a Responses or completions request, whose routing view `request` and `raw` are
        (`gateway.serving.openai.endpoints`); None for a chat request. `key`: the caller's API key (its limits apply
        inside the tenant's; its id goes on the cost records). `batch`: the batch line the request is (sent in the
        batch lane, priced at the batch discount, recorded with its batch id and custom_id)."""
        # the tenant's input guards, before admission and routing: all that follows sees the redacted body
        screened = self._guard.screen(self._policies.current.policy, tenant, request, raw)
        if native is not None and not native.endpoint.redaction and screened.raw is not raw:
            raise BadRequest(f"the tenant's input guards rewrite prompts (redaction), which {native.endpoint.path} "
                             "does not support here; use /v1/chat/completions", code="guard_unsupported_endpoint")
        started, started_wall = time.monotonic(), time.time()
        loaded = self._policies.current
        self._parts.degradation.use_policy(loaded)
        ctx = RequestContext(screened.request, screened.raw, tenant, request_id, loaded, self._parts.degradation.state,
                             native, headers or {}, key, started=started, started_wall=started_wall, batch=batch)
        async with self._parts.admission.refunds(request_id):  # refused after admission: its limits and hold go back
            ctx, call = await self._planner.plan(ctx)
            reply = await self._layers.send(ctx, call)
        self._parts.metrics.route_taken(reply.decision.route)
        if self._learning is not None and ctx.endpoint.learning:
            self._learning.observe(reply, ctx.raw, tenant, request_id, self._policies.current)
        return replace(reply, headers={**reply.headers, **screened.headers}) if screened.decisions else reply
