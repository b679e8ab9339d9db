"""Token usage of one request, from the engine when it said so, else counted with the pool's tokenizer.

Counting goes through the engine's own `/tokenize` endpoint (vLLM), so the gateway needs no copy of each
pool's tokenizer and counts exactly as the engine would. If that fails too, it estimates (4 chars a
token) and says so in `source`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from backends.engine_client import EngineClient, EngineError

__all__ = ["Usage", "count_usage", "usage_from_json"]

log = logging.getLogger("cascade.usage")


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    source: str = "engine"  # "engine" | "tokenizer" | "estimate"


def usage_from_json(obj: Mapping[str, Any]) -> Usage | None:
    """The `usage` object of an OpenAI response or chunk, if present and well-formed."""
    usage = obj.get("usage")
    if not isinstance(usage, Mapping):
        return None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return None
    return Usage(prompt, completion, "engine")


async def _tokenize_count(client: EngineClient, base_url: str, payload: dict[str, Any]) -> int:
    body = await client.post_json(base_url, "/tokenize", orjson.dumps(payload))
    count = orjson.loads(body).get("count")
    if not isinstance(count, int):
        raise EngineError("tokenize answered without a count")
    return count


async def count_usage(
    client: EngineClient,
    base_url: str,
    model: str,
    messages: Sequence[Mapping[str, Any]],
    completion_text: str,
) -> Usage:
    """Count prompt tokens (with the chat template) and completion tokens with the engine's tokenizer."""
    try:
        prompt = await _tokenize_count(
            client, base_url, {"model": model, "messages": list(messages), "add_generation_prompt": True}
        )
        completion = 0
        if completion_text:
            completion = await _tokenize_count(
                client, base_url, {"model": model, "prompt": completion_text, "add_special_tokens": False}
            )
        return Usage(prompt, completion, "tokenizer")
    except (EngineError, ValueError) as exc:
        log.warning("token count via engine failed, estimating", extra={"error": str(exc)})
        chars = sum(len(str(m.get("content") or "")) for m in messages)
        return Usage(max(1, chars // 4), len(completion_text) // 4, "estimate")
