"""Turn an engine's SSE stream into one OpenAI chat.completion object (for the force_stream ladder step:
the engine streams, the client that asked for JSON still gets JSON)."""

from __future__ import annotations

import time
from typing import Any

from gateway.serving.proxy import OpenStream
from gateway.serving.streaming import sse_json
from gateway.serving.usage import Usage, usage_from_json

__all__ = ["assemble_stream"]


def _has_content(chunk: bytes) -> bool:
    return b'"content":"' in chunk.replace(b'"content":""', b"")


def _apply(chunk: dict[str, Any], answer: dict[str, Any], parts: list[str]) -> None:
    """Fold one chunk into `answer` and its text into `parts`."""
    for key in ("id", "created", "model", "system_fingerprint"):
        if key in chunk and key not in answer:
            answer[key] = chunk[key]
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") or {}
        if delta.get("content"):
            parts.append(delta["content"])
        if choice.get("finish_reason"):
            answer["finish_reason"] = choice["finish_reason"]


async def assemble_stream(opened: OpenStream, started: float) -> tuple[dict[str, Any], Usage | None, float | None]:
    """Read the whole stream. Returns (chat.completion object, engine usage or None, TTFT seconds or None)."""
    answer: dict[str, Any] = {}
    parts: list[str] = []
    usage: Usage | None = None
    ttft: float | None = None
    chunks = [opened.first_chunk]
    if _has_content(opened.first_chunk):
        ttft = time.monotonic() - started
    async for chunk in opened.chunks:
        if ttft is None and _has_content(chunk):
            ttft = time.monotonic() - started
        chunks.append(chunk)
    for event in b"".join(chunks).split(b"\n\n"):
        for data in sse_json(event):
            _apply(data, answer, parts)
            usage = usage_from_json(data) or usage
    message = {"role": "assistant", "content": "".join(parts)}
    out = {
        "id": answer.get("id", "chatcmpl-cascade"), "object": "chat.completion", "created": answer.get("created", 0),
        "model": answer.get("model"),
        "choices": [{"index": 0, "message": message, "finish_reason": answer.get("finish_reason", "stop")}],
    }
    if usage is not None:
        out["usage"] = {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
                        "total_tokens": usage.prompt_tokens + usage.completion_tokens}
    return out, usage, ttft
