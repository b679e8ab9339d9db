"""The engine's request body for a routed request, shaped by the ladder steps that act on its pool."""

from __future__ import annotations

from typing import Any

from gateway.serving.openai.schema import ChatRequest
from policies.context import estimate_tokens
from policies.decide import RouteDecision
from policies.ladder import LadderState
from policies.truncate import truncate_messages

__all__ = ["BILLED_STREAM_OPTIONS", "prepare_upstream"]

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
