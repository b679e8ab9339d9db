"""The Responses API over a pool that speaks chat completions only (a remote pool with `responses: chat`).

The request is translated into a chat request; the answer back into a Responses object, or, streamed, the chat
chunks into Responses events (`response.created`, `response.output_item.added`, `response.output_text.delta`,
`response.function_call_arguments.delta`, ..., `response.completed` with the usage), which the relay then watches
as it watches a native Responses stream.

Translated: `instructions`; message items (text and image parts), `function_call` and `function_call_output` items
as assistant tool calls and tool turns; `max_output_tokens`, `temperature`, `top_p`, `user`, `metadata`,
`parallel_tool_calls`; function `tools` and `tool_choice`; `text.format` (json_schema, json_object) as
`response_format`. Refused with 400: tools other than functions, and `store: true` (a chat-only pool keeps nothing
to read back; previous_response_id is refused on every pool, `gateway.serving.openai.responses_schema`). Other Responses
fields (`reasoning`, `include`, `truncation`, ...) have no chat equivalent and are not sent.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import orjson

from gateway.errors import BadRequest
from gateway.serving.sending.streaming import sse_json

__all__ = ["ChatToResponsesStream", "chat_request", "response_object"]

_PASSED = ("temperature", "top_p", "user", "metadata", "parallel_tool_calls")


def _part(part: Any) -> dict[str, Any]:
    if isinstance(part, Mapping) and part.get("type") == "input_image":
        return {"type": "image_url", "image_url": {"url": part.get("image_url")}}
    text = part.get("text", "") if isinstance(part, Mapping) else str(part)
    return {"type": "text", "text": text}


def _content(content: Any) -> Any:
    return content if isinstance(content, str) else [_part(p) for p in content or ()]


def _messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if body.get("instructions"):
        out.append({"role": "system", "content": body["instructions"]})
    given = body.get("input")
    for item in [{"role": "user", "content": given}] if isinstance(given, str) else given or ():
        kind = item.get("type") or "message"
        if kind == "message":
            out.append({"role": item["role"], "content": _content(item.get("content"))})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments", "")}}
            if out and out[-1]["role"] == "assistant" and "tool_calls" in out[-1]:
                out[-1]["tool_calls"].append(call)  # parallel calls of one turn
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": item.get("output", "")})
    return out


def _tools(body: Mapping[str, Any], pool: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    tools = body.get("tools") or []
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, Mapping) else tool
            raise BadRequest(f"tools[{i}]: tool type {kind!r} cannot be served by pool {pool!r}, which speaks chat "
                             "completions only (function tools can)", param=f"tools[{i}].type",
                             code="unsupported_tool_type")
    if tools:
        out["tools"] = [{"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters",
                                                                            "strict") if k in t}} for t in tools]
    choice = body.get("tool_choice")
    if isinstance(choice, Mapping) and choice.get("type") == "function":
        out["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    elif choice is not None:
        out["tool_choice"] = choice
    return out


def _format(body: Mapping[str, Any]) -> dict[str, Any]:
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, Mapping) else None
    if not isinstance(fmt, Mapping) or fmt.get("type") not in ("json_schema", "json_object"):
        return {}
    if fmt["type"] == "json_object":
        return {"response_format": {"type": "json_object"}}
    schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
    return {"response_format": {"type": "json_schema", "json_schema": schema}}


def chat_request(body: Mapping[str, Any], pool: str) -> dict[str, Any]:
    """The chat request of a (validated) Responses request body for chat-only pool `pool`. Raises BadRequest
    for what cannot be translated."""
    if body.get("store") is True:
        raise BadRequest(f"store: pool {pool!r} speaks chat completions only and keeps no responses to read back; "
                         "send store: false (or leave it out)", param="store", code="stateful_request_unsupported")
    chat: dict[str, Any] = {"model": body.get("model"), "messages": _messages(body),
                            **{k: body[k] for k in _PASSED if body.get(k) is not None}, **_tools(body, pool),
                            **_format(body)}
    if body.get("max_output_tokens") is not None:
        chat["max_completion_tokens"] = body["max_output_tokens"]
    if body.get("stream") is True:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


def _usage(usage: Any) -> dict[str, int] | None:
    if not isinstance(usage, Mapping):
        return None
    prompt, completion = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    return {"input_tokens": prompt, "output_tokens": completion, "total_tokens": prompt + completion}


def _envelope(body: Mapping[str, Any], rid: str, created: int, model: str, status: str) -> dict[str, Any]:
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {"id": rid, "object": "response", "created_at": created, "model": model, "status": status,
            "error": None, "incomplete_details": incomplete, "instructions": body.get("instructions"),
            "metadata": body.get("metadata"), "tools": body.get("tools") or [],
            "tool_choice": body.get("tool_choice", "auto"),
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "temperature": body.get("temperature"), "top_p": body.get("top_p"),
            "max_output_tokens": body.get("max_output_tokens"), "output": [], "usage": None}


def _message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": []}] if status == "completed" else []
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": content}


def _call_item(item_id: str, call_id: str, name: str, arguments: str, status: str = "completed") -> dict[str, Any]:
    return {"id": item_id, "type": "function_call", "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


def response_object(body: Mapping[str, Any], answer: bytes) -> bytes:
    """The Responses object of the chat answer `answer` to the request `body` (its first choice)."""
    chat = orjson.loads(answer)
    choice = (chat.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    status = "incomplete" if choice.get("finish_reason") == "length" else "completed"
    out = _envelope(body, f"resp_{chat.get('id', '')}", int(chat.get("created") or time.time()),
                    str(chat.get("model", "")), status)
    if message.get("content"):
        out["output"].append(_message_item(f"msg_{chat.get('id', '')}", message["content"]))
    for i, call in enumerate(message.get("tool_calls") or ()):
        fn = call.get("function") or {}
        out["output"].append(_call_item(f"fc_{i}_{chat.get('id', '')}", call.get("id", ""), fn.get("name", ""),
                                        fn.get("arguments", "")))
    out["usage"] = _usage(chat.get("usage"))
    return orjson.dumps(out)


class ChatToResponsesStream:
    """Chat completion chunks in, Responses events out (`events()`, SSE bytes). Owns nothing: the caller closes
    the upstream it reads from."""

    def __init__(self, body: Mapping[str, Any], first: bytes, chunks: AsyncIterator[bytes]) -> None:
        self._body, self._first, self._chunks = body, first, chunks
        self._seq = 0
        self._id, self._model, self._created = "resp_chat", str(body.get("model", "")), int(time.time())
        self._text: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}  # chat tool-call index -> its item (arguments so far)
        self._outputs: list[dict[str, Any]] = []  # items in output order: the message first if it came first
        self._finish: str | None = None
        self._usage: dict[str, int] | None = None

    def _event(self, kind: str, **fields: Any) -> bytes:
        self._seq += 1
        data = orjson.dumps({"type": kind, "sequence_number": self._seq - 1, **fields})
        return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"

    def _response(self, status: str) -> dict[str, Any]:
        return _envelope(self._body, self._id, self._created, self._model, status)

    async def events(self) -> AsyncIterator[bytes]:
        buffer, started = b"", False
        async for chunk in _chain(self._first, self._chunks):
            parts = (buffer + chunk).split(b"\n\n")
            buffer = parts.pop()
            out = b""
            for event in parts:
                for obj in sse_json(event):
                    if not started:
                        self._id = f"resp_{obj.get('id', 'chat')}"
                        self._model = str(obj.get("model", self._model))
                        out += self._event("response.created", response=self._response("in_progress"))
                        started = True
                    out += self._chunk(obj)
            if out:
                yield out
        if not started:
            return  # nothing came: the relay counts what it can, the client sees the stream end
        yield self._close()

    def _chunk(self, obj: Mapping[str, Any]) -> bytes:
        if obj.get("usage"):
            self._usage = _usage(obj["usage"])
        out = b""
        for choice in obj.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue  # the Responses API has one output; n > 1 is not translated
            delta = choice.get("delta") or {}
            if delta.get("content"):
                out += self._text_delta(delta["content"])
            for call in delta.get("tool_calls") or ():
                out += self._call_delta(call)
            self._finish = choice.get("finish_reason") or self._finish
        return out

    def _text_delta(self, text: str) -> bytes:
        out = b""
        if not self._text:
            item = _message_item(f"msg_{self._id}", "", "in_progress")
            self._outputs.append(item)
            out += self._event("response.output_item.added", output_index=len(self._outputs) - 1, item=item)
            out += self._event("response.content_part.added", item_id=item["id"], output_index=len(self._outputs) - 1,
                               content_index=0, part={"type": "output_text", "text": "", "annotations": []})
        self._text.append(text)
        index = next(i for i, o in enumerate(self._outputs) if o["type"] == "message")
        return out + self._event("response.output_text.delta", item_id=self._outputs[index]["id"],
                                 output_index=index, content_index=0, delta=text)

    def _call_delta(self, call: Mapping[str, Any]) -> bytes:
        out, key = b"", int(call.get("index", 0))
        fn = call.get("function") or {}
        if key not in self._calls:
            item = _call_item(f"fc_{key}_{self._id}", str(call.get("id", "")), str(fn.get("name") or ""), "",
                              "in_progress")
            self._calls[key] = item
            self._outputs.append(item)
            out += self._event("response.output_item.added", output_index=len(self._outputs) - 1, item=item)
        item = self._calls[key]
        piece = fn.get("arguments") or ""
        if piece:
            item["arguments"] += piece
            out += self._event("response.function_call_arguments.delta", item_id=item["id"],
                               output_index=self._outputs.index(item), delta=piece)
        return out

    def _close(self) -> bytes:
        out = b""
        for index, item in enumerate(self._outputs):
            if item["type"] == "message":
                text = "".join(self._text)
                out += self._event("response.output_text.done", item_id=item["id"], output_index=index,
                                   content_index=0, text=text)
                done = _message_item(item["id"], text)
            else:
                out += self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                                   arguments=item["arguments"])
                done = {**item, "status": "completed"}
            self._outputs[index] = done
            out += self._event("response.output_item.done", output_index=index, item=done)
        status = "incomplete" if self._finish == "length" else "completed"
        final = {**self._response(status), "output": self._outputs, "usage": self._usage}
        return out + self._event(f"response.{status}", response=final)


async def _chain(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    if first:
        yield first
    async for chunk in rest:
        yield chunk
