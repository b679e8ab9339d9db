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
from gateway.serving.openai.completions_schema import prompt_parts
from gateway.serving.openai.endpoints import COMPLETIONS, RESPONSES
from gateway.serving.openai.responses_schema import input_messages
from gateway.serving.openai.usage import Usage, count_usage
from policies.pools import LocalPool, RemotePool

__all__ = ["count_request_usage"]


async def count_request_usage(endpoint: str, pool: LocalPool | RemotePool | None, client: EngineClient,
                              base_url: str, model: str, upstream: Mapping[str, Any], completion_text: str) -> Usage:
    """`count_usage` for the body `upstream` of `endpoint` (its name: "chat", "responses", "completions"), its
    completion tokens capped by the request's own limit (`_capped`)."""
    return _capped(await _count(endpoint, pool, client, base_url, model, upstream, completion_text), upstream)


def _capped(usage: Usage, upstream: Mapping[str, Any]) -> Usage:
    """At most the request's token limit (`max_completion_tokens`, `max_tokens` or `max_output_tokens`, times `n`
    choices) as completion tokens: the engine generated no more. Re-tokenizing the text relayed can count more than
    it generated (pieces of broken UTF-8 tokenize apart: 970 for a stream of at most 900 cut short by its client)."""
    limit = next((v for k in ("max_completion_tokens", "max_tokens", "max_output_tokens")
                  if type(v := upstream.get(k)) is int and v > 0), None)
    choices = upstream.get("n")
    if limit is None:
        return usage
    limit *= choices if type(choices) is int and choices > 1 else 1
    return usage if usage.completion_tokens <= limit else replace(usage, completion_tokens=limit)


async def _count(endpoint: str, pool: LocalPool | RemotePool | None, client: EngineClient, base_url: str, model: str,
                 upstream: Mapping[str, Any], completion_text: str) -> Usage:
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
