"""Count a request's usage from its engine body when the engine reported none, for each endpoint.

The chat body's messages and the Responses input (as chat turns: `responses_schema.input_messages`) are counted
with the chat template; a completions prompt is counted as it is, and its token-array prompts by their length.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from backends.clients.shared import EngineClient
from gateway.errors import BadRequest
from gateway.serving.completions_schema import prompt_parts
from gateway.serving.endpoints import COMPLETIONS, RESPONSES
from gateway.serving.responses_schema import input_messages
from gateway.serving.usage import Usage, count_usage
from policies.pools import LocalPool, RemotePool

__all__ = ["count_request_usage"]


async def count_request_usage(endpoint: str, pool: LocalPool | RemotePool | None, client: EngineClient,
                              base_url: str, model: str, upstream: Mapping[str, Any], completion_text: str) -> Usage:
    """`count_usage` for the body `upstream` of `endpoint` (its name: "chat", "responses", "completions")."""
    if endpoint == RESPONSES.name:
        try:
            messages: list[Any] = list(input_messages(upstream))
        except BadRequest:  # validated when parsed; a body changed since is counted from what can be read
            messages = []
        return await count_usage(pool, client, base_url, model, messages, completion_text)
    if endpoint == COMPLETIONS.name:
        texts, given = prompt_parts(upstream.get("prompt")) or ([], 0)
        if not texts:
            counted = await count_usage(pool, client, base_url, model, [], completion_text, "")
            return replace(counted, prompt_tokens=given)
        counted = await count_usage(pool, client, base_url, model, [], completion_text, "\n".join(texts))
        return replace(counted, prompt_tokens=counted.prompt_tokens + given)
    tools = upstream.get("tools")
    return await count_usage(pool, client, base_url, model, upstream["messages"], completion_text,
                             tools=tools if isinstance(tools, list) else None)
