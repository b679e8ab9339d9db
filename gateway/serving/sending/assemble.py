"""Turn an engine's SSE stream into the chat.completion object the engine would have answered (for the
force_stream ladder step: the engine streams, the client that asked for JSON still gets its JSON).

The fold follows the OpenAI streaming contract: chunks carry deltas per choice `index`; text fields
(`content`, `refusal`, `reasoning_content`) concatenate; `tool_calls` deltas merge by their own `index`
(the first one brings `id`, `type` and the function's `name`, later ones append to `arguments`);
`logprobs.content` / `logprobs.refusal` lists concatenate; the last `finish_reason` (and vLLM's
`stop_reason`) wins; the usage chunk is copied whole. Fields the fold does not know are kept as the last
chunk gave them, so an engine's extension is not dropped silently.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from gateway.serving.openai.usage import Usage, usage_from_json
from gateway.serving.sending.proxy import OpenStream
from gateway.serving.sending.streaming import sse_json

__all__ = ["StreamAssembly", "assemble_events", "assemble_stream"]

_TEXT = ("content", "refusal", "reasoning_content", "reasoning")
_TOP = ("id", "created", "model", "system_fingerprint", "service_tier")
_FIRST_TOKEN = (b'"content":"', b'"tool_calls":[', b'"reasoning_content":"', b'"refusal":"')


def _has_token(chunk: bytes) -> bool:
    """A chunk that carries generated output (TTFT): text, a tool call or a refusal; not the role chunk."""
    chunk = chunk.replace(b'"content":""', b"")
    return any(marker in chunk for marker in _FIRST_TOKEN)


class _Choice:
    """One choice being assembled from its deltas."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.role = "assistant"
        self.text: dict[str, list[str]] = {}
        self.calls: dict[int, dict[str, Any]] = {}
        self.logprobs: dict[str, list[Any]] | None = None
        self.extra: dict[str, Any] = {}
        self.finish_reason: str | None = None

    def fold(self, choice: dict[str, Any]) -> None:
        delta = choice.get("delta") or {}
        for key, value in delta.items():
            if key == "role" and isinstance(value, str):
                self.role = value
            elif key in _TEXT:
                if isinstance(value, str):
                    self.text.setdefault(key, []).append(value)
            elif key == "tool_calls":
                for call in value or ():
                    self._fold_call(call)
            elif value is not None:
                self.extra[key] = value
        lp = choice.get("logprobs")
        if isinstance(lp, dict):
            self.logprobs = self.logprobs or {}
            for key, items in lp.items():
                if isinstance(items, list):
                    self.logprobs.setdefault(key, []).extend(items)
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]
        if "stop_reason" in choice and choice["stop_reason"] is not None:
            self.extra["stop_reason"] = choice["stop_reason"]

    def _fold_call(self, call: dict[str, Any]) -> None:
        index = call.get("index", len(self.calls))
        into = self.calls.setdefault(index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
        for key in ("id", "type"):
            if call.get(key):
                into[key] = call[key]
        function = call.get("function") or {}
        if function.get("name"):
            into["function"]["name"] = function["name"]
        if isinstance(function.get("arguments"), str):
            into["function"]["arguments"] += function["arguments"]

    def render(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": self.role}
        for key in _TEXT:
            if key in self.text:
                message[key] = "".join(self.text[key])
        # OpenAI: `content` is null when the answer is only tool calls, "" when it is empty text.
        message.setdefault("content", None if self.calls else "")
        if self.calls:
            message["tool_calls"] = [self.calls[i] for i in sorted(self.calls)]
        stop_reason = self.extra.pop("stop_reason", None)
        message.update(self.extra)
        out: dict[str, Any] = {"index": self.index, "message": message, "logprobs": self.logprobs,
                               "finish_reason": self.finish_reason or "stop"}
        if stop_reason is not None:
            out["stop_reason"] = stop_reason
        return out


class StreamAssembly:
    """Folds the JSON chunks of one stream, in order, into a chat.completion object."""

    def __init__(self) -> None:
        self._top: dict[str, Any] = {}
        self._choices: dict[int, _Choice] = {}
        self.usage_object: dict[str, Any] | None = None

    def fold(self, chunk: dict[str, Any]) -> None:
        for key in _TOP:
            if chunk.get(key) is not None:
                self._top.setdefault(key, chunk[key])
        for choice in chunk.get("choices") or ():
            index = choice.get("index", 0)
            self._choices.setdefault(index, _Choice(index)).fold(choice)
        if isinstance(chunk.get("usage"), dict):
            self.usage_object = chunk["usage"]

    def answer(self) -> dict[str, Any]:
        choices = self._choices or {0: _Choice(0)}
        out = {"id": self._top.get("id", "chatcmpl-cascade"), "object": "chat.completion",
               "created": self._top.get("created", 0), "model": self._top.get("model"),
               "choices": [choices[i].render() for i in sorted(choices)]}
        out.update({k: self._top[k] for k in ("system_fingerprint", "service_tier") if k in self._top})
        if self.usage_object is not None:
            out["usage"] = self.usage_object
        return out


def assemble_events(events: Iterable[bytes]) -> StreamAssembly:
    """Fold SSE events (each one or more `data:` lines) in order."""
    assembly = StreamAssembly()
    for event in events:
        for data in sse_json(event):
            assembly.fold(data)
    return assembly


async def assemble_stream(opened: OpenStream, started: float) -> tuple[dict[str, Any], Usage | None, float | None]:
    """Read the whole stream. Returns (chat.completion object, engine usage or None, TTFT seconds or None)."""
    ttft: float | None = None
    chunks = [opened.first_chunk]
    if _has_token(opened.first_chunk):
        ttft = time.monotonic() - started
    async for chunk in opened.chunks:
        if ttft is None and _has_token(chunk):
            ttft = time.monotonic() - started
        chunks.append(chunk)
    assembly = assemble_events(b"".join(chunks).split(b"\n\n"))
    usage = usage_from_json({"usage": assembly.usage_object}) if assembly.usage_object is not None else None
    return assembly.answer(), usage, ttft
