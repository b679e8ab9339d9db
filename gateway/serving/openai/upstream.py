"""The engine's request body for a routed request, shaped by the ladder steps that act on its pool."""

from __future__ import annotations

from typing import Any

from gateway.serving.openai.schema import ChatRequest
from policies.batches import priority_scheduled
from policies.context import estimate_tokens
from policies.decide import RouteDecision
from policies.ladder import LadderState
from policies.schema import Policy
from policies.truncate import truncate_messages

__all__ = ["BILLED_STREAM_OPTIONS", "engine_body", "prepare_upstream"]

BILLED_STREAM_OPTIONS = {"include_usage": True}
"""What a stream asks the engine for, whatever the client sent: one usage event, at the end, which the ledger bills
(the client sees it only if it asked for `include_usage`). vLLM's `continuous_usage_stats` is not passed on: with it
every chunk carries a running total, and a client could have had a stream billed from its first chunk's."""


def prepare_upstream(raw: dict[str, Any], decision: RouteDecision, request: ChatRequest,
                     ladder: LadderState) -> tuple[dict[str, Any], dict[str, str]]:
    """The engine's request body for `decision.pool` and the extra response headers saying what the ladder did
    to it. Truncation comes from the steps that act on that pool (`LadderState.applying_to`); `raw` is the
    client's body and is not changed."""
    upstream = dict(raw, model=decision.model)
    extra: dict[str, str] = {}
    if request.stream:
        upstream["stream_options"] = dict(BILLED_STREAM_OPTIONS)
    limit = ladder.applying_to(decision.pool).truncate_tokens
    if limit is not None:
        kept, dropped = truncate_messages(raw["messages"], limit, estimate_tokens)
        if kept != raw["messages"]:
            upstream["messages"] = kept
            extra["x-cascade-truncated"] = str(dropped)
    if ladder.active:
        extra["x-cascade-degraded"] = ",".join(ladder.names)
    return upstream, extra


def engine_body(upstream: dict[str, Any], policy: Policy, decision: RouteDecision, batch_line: bool) -> dict[str, Any]:
    """`upstream` as the engine version `decision` names takes it (`decision.pool_version`, set by the version the
    request goes to). Where that version schedules by priority (`policies.batches.priority_scheduled`), `priority`
    is the gateway's: a batch line's is the policy's `batches.engine_priority` (None: none), any other request's
    none, so the engine's 0 (a client's own is dropped: it would jump other tenants' requests). Elsewhere `upstream`
    itself, unchanged. `upstream` is never changed: a changed body is a new dict."""
    if not priority_scheduled(policy.pools.get(decision.pool), decision.pool_version):
        return upstream
    body = {k: v for k, v in upstream.items() if k != "priority"}
    if batch_line and policy.batches.engine_priority is not None:
        body["priority"] = policy.batches.engine_priority
    return body
