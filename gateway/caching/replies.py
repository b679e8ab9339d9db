"""A cache hit as the client's reply: the cached chat.completion as JSON, or replayed as an SSE stream of
chat.completion.chunk events (role and text per choice, then each choice's finish, then usage, then `[DONE]`),
which the StreamRelay carries like an engine's stream (it drops the usage event unless the client asked for it).
The answer gets a fresh `id` and `created`; everything else is the engine's.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from typing import Any

import orjson

from gateway.caching.entry import CacheEntry
from gateway.serving.sending.streaming import StreamRelay

__all__ = ["answer_body", "sse_events", "stream_relay"]


def answer_body(entry: CacheEntry, request_id: str) -> dict[str, Any]:
    """The cached answer under a fresh id (from the gateway's request id) and the time it is served."""
    return {**entry.body, "id": f"chatcmpl-{request_id}", "created": int(time.time())}


def _chunk(body: dict[str, Any], choices: list[dict[str, Any]], **extra: Any) -> bytes:
    chunk = {"id": body["id"], "object": "chat.completion.chunk", "created": body["created"],
             "model": body.get("model"), "choices": choices, **extra}
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def sse_events(body: dict[str, Any]) -> bytes:
    """The SSE events that stream `body` (a chat.completion object)."""
    out = []
    for choice in body["choices"]:
        message = choice.get("message") or {}
        delta = {"role": message.get("role") or "assistant",
                 **{k: v for k, v in message.items() if k != "role" and v is not None}}
        first: dict[str, Any] = {"index": choice.get("index", 0), "delta": delta, "finish_reason": None}
        if choice.get("logprobs") is not None:
            first["logprobs"] = choice["logprobs"]
        out.append(_chunk(body, [first]))
    finish = [{"index": c.get("index", 0), "delta": {}, "finish_reason": c.get("finish_reason")}
              for c in body["choices"]]
    out.append(_chunk(body, finish))
    if isinstance(body.get("usage"), dict):
        out.append(_chunk(body, [], usage=body["usage"]))
    out.append(b"data: [DONE]\n\n")
    return b"".join(out)


async def _nothing() -> AsyncIterator[bytes]:
    return
    yield b""  # an async generator that ends at once


def stream_relay(body: dict[str, Any], forward_usage: bool, started: float,
                 on_finish: Callable[[StreamRelay], None]) -> StreamRelay:
    """A relay that streams `body` from memory; `on_finish` as for an engine's relay."""
    return StreamRelay(sse_events(body), _nothing(), AsyncExitStack(), forward_usage, started, on_finish)
