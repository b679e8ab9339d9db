"""The fake upstream's `/v1/responses` and `/v1/completions`, shaped as vLLM 0.32 answers them.

Responses: an object with one output message (`output_text` parts) and `usage` as `input_tokens` /
`output_tokens`; streamed as `event:`/`data:` pairs, `response.created` (usage null), one
`response.output_text.delta` per token, `response.completed` carrying the usage, and no `[DONE]`. Completions: one
choice per prompt and `n`, `text` per choice, streamed as chunks with `text` deltas, the usage chunk when
`stream_options.include_usage`, then `[DONE]`. Prompt tokens: one per whitespace-separated word (plus 3 per input
item or message, as the chat fake counts), a token array's length. The knobs are the chat fake's (`metadata`:
`fake_tokens`, `fake_delay_ms`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
from starlette.types import Send

__all__ = ["completions_events", "completions_json", "input_tokens", "paced", "responses_events", "responses_json",
           "serve_other"]

Event = Callable[[bytes], Awaitable[None]]


async def paced(n: int, delay: float) -> AsyncIterator[int]:
    """0 .. n-1, each `delay` s after the one before was due: the answer keeps its own clock, as an engine's steps do,
    so a loop that wakes late (a starved host) delays one token, not every token after it (sleeping `delay` before
    each let the lateness add up: the fake's capacity fell with the host's load)."""
    clock = asyncio.get_running_loop()
    due = clock.time()
    for i in range(n):
        if delay:
            due += delay
            await asyncio.sleep(max(0.0, due - clock.time()))
        yield i


def _words(value: Any) -> int:
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, list):
        return sum(_words(p.get("text") if isinstance(p, dict) else p) for p in value)
    return 0


def input_tokens(req: dict[str, Any]) -> int:
    """The fake's count of a Responses request's input: words, plus 3 per item (and the instructions)."""
    given = req.get("input")
    items = [{"content": given}] if isinstance(given, str) else [i for i in given or () if isinstance(i, dict)]
    count = sum(3 + _words(i.get("content", i.get("output", ""))) for i in items)
    return count + (3 + _words(req["instructions"]) if req.get("instructions") else 0)


def _tokens(req: dict[str, Any], limit_field: str) -> int:
    n = int((req.get("metadata") or {}).get("fake_tokens", 16))
    limit = req.get(limit_field)
    return min(n, int(limit)) if limit else n


def _response(req: dict[str, Any], text: str, status: str, usage: dict[str, int] | None) -> dict[str, Any]:
    message = {"id": "msg_fake", "type": "message", "role": "assistant", "status": "completed",
               "content": [{"type": "output_text", "text": text, "annotations": []}]}
    return {"id": "resp_fake", "object": "response", "created_at": int(time.time()), "model": req.get("model"),
            "status": status, "output": [message] if status != "in_progress" else [], "usage": usage,
            "tool_choice": req.get("tool_choice", "auto"), "tools": req.get("tools", []), "parallel_tool_calls": True}


def _responses_usage(req: dict[str, Any], n: int) -> dict[str, int]:
    prompt = input_tokens(req)
    return {"input_tokens": prompt, "output_tokens": n, "total_tokens": prompt + n}


def responses_json(req: dict[str, Any]) -> dict[str, Any]:
    n = _tokens(req, "max_output_tokens")
    return _response(req, "".join(f" w{i}" for i in range(n)), "completed", _responses_usage(req, n))


async def responses_events(req: dict[str, Any], emit: Event, gone: asyncio.Event, delay: float) -> bool:
    """Stream a Responses answer through `emit`; False when the client left before the end."""
    n = _tokens(req, "max_output_tokens")

    async def event(kind: str, obj: dict[str, Any]) -> None:
        await emit(b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({**obj, "type": kind}) + b"\n\n")

    await event("response.created", {"response": _response(req, "", "in_progress", None), "sequence_number": 0})
    async for i in paced(n, delay):
        if gone.is_set():
            return False
        await event("response.output_text.delta", {"item_id": "msg_fake", "output_index": 0, "content_index": 0,
                                                   "delta": f" w{i}", "sequence_number": i + 1})
    done = _response(req, "".join(f" w{i}" for i in range(n)), "completed", _responses_usage(req, n))
    await event("response.completed", {"response": done, "sequence_number": n + 1})
    return True


def _prompts(req: dict[str, Any]) -> list[int]:
    """The prompt tokens of each prompt of a completions request."""
    prompt = req.get("prompt")
    if isinstance(prompt, str):
        return [len(prompt.split())]
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return [len(prompt)]
    return [len(p.split()) if isinstance(p, str) else len(p) for p in prompt or ()]


def _completions_usage(req: dict[str, Any], n: int) -> dict[str, int]:
    prompts = _prompts(req)
    completion = n * len(prompts) * int(req.get("n") or 1)
    return {"prompt_tokens": sum(prompts), "completion_tokens": completion, "total_tokens": sum(prompts) + completion}


def completions_json(req: dict[str, Any]) -> dict[str, Any]:
    n, choices = _tokens(req, "max_tokens"), len(_prompts(req)) * int(req.get("n") or 1)
    text = "".join(f" w{i}" for i in range(n))
    return {"id": "cmpl-fake", "object": "text_completion", "created": int(time.time()), "model": req.get("model"),
            "choices": [{"index": c, "text": text, "logprobs": None, "finish_reason": "length"}
                        for c in range(choices)],
            "usage": _completions_usage(req, n)}


async def completions_events(req: dict[str, Any], emit: Event, gone: asyncio.Event, delay: float) -> bool:
    """Stream a completion through `emit`; False when the client left before the end."""
    n, choices = _tokens(req, "max_tokens"), len(_prompts(req)) * int(req.get("n") or 1)
    head = {"id": "cmpl-fake", "object": "text_completion", "created": int(time.time()), "model": req.get("model")}
    async for i in paced(n, delay):
        if gone.is_set():
            return False
        for c in range(choices):
            reason = "length" if i == n - 1 else None
            chunk = {**head, "choices": [{"index": c, "text": f" w{i}", "logprobs": None, "finish_reason": reason}]}
            await emit(b"data: " + orjson.dumps(chunk) + b"\n\n")
    if (req.get("stream_options") or {}).get("include_usage"):
        await emit(b"data: " + orjson.dumps({**head, "choices": [], "usage": _completions_usage(req, n)}) + b"\n\n")
    await emit(b"data: [DONE]\n\n")
    return True


async def serve_other(path: str, req: dict[str, Any], send: Send, gone: asyncio.Event, delay: float) -> bool:
    """Answer `req` on `path` (one of the two endpoints); False when a stream's client left before its end."""
    responses = path == "/v1/responses"
    if not req.get("stream"):
        out = responses_json(req) if responses else completions_json(req)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": orjson.dumps(out)})
        return True

    async def emit(chunk: bytes) -> None:
        await send({"type": "http.response.body", "body": chunk, "more_body": True})

    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    whole = await (responses_events if responses else completions_events)(req, emit, gone, delay)
    await send({"type": "http.response.body", "body": b"", "more_body": False})
    return whole
