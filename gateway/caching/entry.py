"""A cached answer and its codec: the chat.completion object an engine answered, who answered it, its usage.

Stored as JSON. `decode` refuses anything that is not a whole entry of this format (`CorruptEntry`): the caller
drops it and serves the request fresh. An answer is kept only when it is whole: every choice finished (`stop` or
`length`: the limit is part of the key) and the engine said its usage, so a hit can be priced.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.serving.openai.usage import Usage

__all__ = ["CacheEntry", "CorruptEntry", "decode", "encode", "entry_of"]

_FORMAT = 1
_FINISHED = frozenset({"stop", "length"})


class CorruptEntry(ValueError):
    """Bytes under a cache key that are not an entry (a bug, another writer, a format change)."""


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """`body`: the chat.completion object as the engine answered it (JSON types). Times are UTC epoch seconds."""

    pool: str
    model: str
    body: dict[str, Any]
    usage: Usage
    stored_at: float


def entry_of(pool: str, model: str, body: Mapping[str, Any], usage: Usage | None) -> CacheEntry | None:
    """The entry for an answer, or None when it is not whole (a choice unfinished, no usage) or not an answer."""
    choices = body.get("choices")
    if usage is None or usage.source != "engine" or not isinstance(choices, list) or not choices:
        return None
    if any(not isinstance(c, Mapping) or c.get("finish_reason") not in _FINISHED
           or not isinstance(c.get("message"), Mapping) for c in choices):
        return None
    return CacheEntry(pool, model, dict(body), usage, time.time())


def encode(entry: CacheEntry) -> bytes:
    return orjson.dumps({"format": _FORMAT, "pool": entry.pool, "model": entry.model, "body": entry.body,
                         "prompt_tokens": entry.usage.prompt_tokens,
                         "completion_tokens": entry.usage.completion_tokens, "stored_at": entry.stored_at})


def decode(raw: bytes) -> CacheEntry:
    """Raises `CorruptEntry` for anything `encode` did not write."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise CorruptEntry(f"not JSON: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
        raise CorruptEntry("not a cache entry of format 1")
    pool, model, body = doc.get("pool"), doc.get("model"), doc.get("body")
    prompt, completion, stored = doc.get("prompt_tokens"), doc.get("completion_tokens"), doc.get("stored_at")
    if not (isinstance(pool, str) and isinstance(model, str) and isinstance(body, dict)):
        raise CorruptEntry("pool, model or body missing")
    if not (isinstance(prompt, int) and isinstance(completion, int) and _count(prompt) and _count(completion)
            and isinstance(stored, int | float)):
        raise CorruptEntry("usage or stored_at missing")
    if entry_of(pool, model, body, Usage(prompt, completion)) is None:
        raise CorruptEntry("the body is not a finished chat.completion")
    return CacheEntry(pool, model, body, Usage(prompt, completion), float(stored))


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
