"""The OpenAI Responses request (`POST /v1/responses`): parsed into the chat path's routing view.

The gateway reads what it routes and prices on: `model`, `input` (a string or a list of items), `instructions`,
`stream`, `max_output_tokens`, `temperature`, `top_p`, `metadata`, `tools`, `text.format`. Everything else passes
through to the engine, which validates it. The view's messages are the input as chat turns: instructions as the
system turn, each message item as its role's turn (text parts only), a function call as an assistant turn naming
it, a function call's output as a tool turn; reasoning items carry no text.

Refused here, with a 400 that says why: an item type the gateway does not know (named in the message), and
everything that needs state kept on an engine between requests (`previous_response_id`, `conversation`,
`item_reference` items, `background: true`): the gateway routes every request anew, so the next request of a
conversation may reach another pool or replica than the one that stored the state. Send the whole conversation in
`input` instead (that is what stateless clients do, and what `store: false` means).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, StrictBool, StrictInt, ValidationError

from gateway.errors import BadRequest
from gateway.serving.openai.endpoints import RESPONSES, NativeBody
from gateway.serving.openai.schema import ChatRequest, NullIsUnset, json_object
from policies.loader import dotted_path

__all__ = ["ITEM_TYPES", "STATEFUL_FIELDS", "ResponsesRequest", "input_messages", "parse_responses_request"]


class _Item(NullIsUnset):
    model_config = ConfigDict(extra="allow", frozen=True)


class ContentPart(_Item):
    type: Literal["input_text", "output_text"]
    text: str


class ImagePart(_Item):
    type: Literal["input_image"]
    image_url: str


class MessageItem(_Item):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart | ImagePart]


class FunctionCallItem(_Item):
    type: Literal["function_call"]
    call_id: str
    name: str = Field(min_length=1)
    arguments: str


class FunctionCallOutputItem(_Item):
    type: Literal["function_call_output"]
    call_id: str
    output: str


class ReasoningItem(_Item):
    type: Literal["reasoning"]


class ResponsesRequest(NullIsUnset):
    """The fields of a Responses request the gateway reads (the published request schema). `input` items are
    checked item by item first (`input_messages`: an unknown type is named); this model checks the rest."""

    model_config = ConfigDict(extra="allow", frozen=True)

    model: str = Field(min_length=1)
    input: str | Annotated[list[MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem],
                           Field(min_length=1)]
    instructions: str | None = None
    stream: StrictBool = False
    max_output_tokens: StrictInt | None = Field(default=None, gt=0)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    metadata: dict[str, str] | None = None
    user: str | None = None
    store: StrictBool | None = Field(default=None, description="the engine's store; nothing the gateway can "
                                     "read back later (previous_response_id is refused)")

ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")
STATEFUL_FIELDS = ("previous_response_id", "conversation")
_ROLES = ("user", "assistant", "system", "developer")
_TEXT_PARTS = ("input_text", "output_text", "text", "refusal")


def _stateful(param: str, what: str) -> BadRequest:
    return BadRequest(f"{param}: {what} needs state stored on one engine, and the gateway routes every request "
                      "anew (the next one may reach another pool or replica); send the whole conversation in `input`",
                      param=param, code="stateful_request_unsupported")


def _part_text(part: Any) -> str:
    if isinstance(part, str):
        return part
    if isinstance(part, Mapping) and part.get("type") in _TEXT_PARTS:
        text = part.get("text", part.get("refusal"))
        return text if isinstance(text, str) else ""
    return ""  # images, files, audio: no text to score


def _content_text(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(t for t in (_part_text(p) for p in content) if t)
    raise BadRequest(f"{param}: must be a string or a list of content parts", param=param, code="invalid_value")


def _item_message(item: Any, param: str) -> dict[str, str] | None:
    """The chat turn of one input item (None for an item without text). Raises BadRequest for an item the
    gateway cannot serve."""
    if not isinstance(item, Mapping):
        raise BadRequest(f"{param}: must be an object (an input item)", param=param, code="invalid_value")
    kind = item.get("type") or "message"  # `null` is not set, as everywhere in the API
    if kind == "item_reference":
        raise _stateful(param, "an item_reference")
    if kind not in ITEM_TYPES:
        raise BadRequest(f"{param}.type: unknown input item type {kind!r}; served: {', '.join(ITEM_TYPES)}",
                         param=f"{param}.type", code="unknown_item_type")
    if kind == "message":
        role = item.get("role")
        if role not in _ROLES:
            raise BadRequest(f"{param}.role: must be one of {', '.join(_ROLES)}, got {role!r}", param=f"{param}.role",
                             code="invalid_value")
        return {"role": str(role), "content": _content_text(item.get("content"), f"{param}.content")}
    if kind == "function_call":
        return {"role": "assistant", "content": f"{item.get('name', '')}({item.get('arguments', '')})"}
    if kind == "function_call_output":
        output = item.get("output")
        return {"role": "tool", "content": output if isinstance(output, str) else _content_text(output, param)}
    return None  # reasoning


def input_messages(body: Mapping[str, Any]) -> list[dict[str, str]]:
    """The Responses request's instructions and input as chat turns (what is scored, and counted when the engine
    gives no usage). Raises BadRequest naming the first item it cannot serve."""
    messages = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    given = body.get("input")
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    elif isinstance(given, list):
        for i, item in enumerate(given):
            message = _item_message(item, f"input[{i}]")
            if message is not None:
                messages.append(message)
    else:
        raise BadRequest("input: must be a string or a list of input items", param="input",
                         code="invalid_value" if "input" in body else "missing_required_parameter")
    return messages


def _check_stateless(raw: Mapping[str, Any]) -> None:
    for name in STATEFUL_FIELDS:
        if raw.get(name) is not None:
            raise _stateful(name, f"`{name}`")
    if raw.get("background") is True:
        raise _stateful("background", "a background response")


def _limit(raw: dict[str, Any], max_tokens_cap: int | None) -> int | None:
    limit = raw.get("max_output_tokens")
    if max_tokens_cap is not None and (limit is None or limit > max_tokens_cap):
        raw["max_output_tokens"] = limit = max_tokens_cap  # clamped, not refused: the engine stops at the cap
    return limit


def _view(raw: Mapping[str, Any], messages: list[dict[str, str]], limit: int | None) -> dict[str, Any]:
    """The chat-shaped body the router, the admission checks and the limits read."""
    view: dict[str, Any] = {"model": raw.get("model"), "messages": messages, "stream": raw.get("stream", False)}
    for name in ("temperature", "top_p", "metadata", "user", "tools"):
        if raw.get(name) is not None:
            view[name] = raw[name]
    if limit is not None:
        view["max_completion_tokens"] = limit
    fmt = (raw.get("text") or {}).get("format") if isinstance(raw.get("text"), Mapping) else None
    if isinstance(fmt, Mapping) and isinstance(fmt.get("type"), str):
        view["response_format"] = {"type": fmt["type"]}
    if view["stream"] is True:
        view["stream_options"] = {"include_usage": True}  # the relay forwards every Responses event
    return view


def parse_responses_request(body: bytes, max_messages: int = 1024, max_tokens_cap: int | None = None,
                            ) -> tuple[ChatRequest, dict[str, Any], NativeBody]:
    """Validate a Responses request body. Returns the routing view (a `ChatRequest` and its dict) and the body
    the engine is sent (`max_output_tokens` clamped to `max_tokens_cap` when one is set). Raises `BadRequest`
    naming the offending field."""
    raw = json_object(body)
    _check_stateless(raw)
    messages = input_messages(raw) or [{"role": "user", "content": ""}]  # reasoning items only: the engine judges
    if len(messages) > max_messages:
        raise BadRequest(f"input: {len(messages)} items; the limit is {max_messages}", param="input",
                         code="too_many_messages")
    raw = {k: v for k, v in raw.items() if v is not None or k not in ResponsesRequest.model_fields}
    try:
        ResponsesRequest.model_validate(raw)
        view = _view(raw, messages, _limit(raw, max_tokens_cap))
        request = ChatRequest.model_validate(view)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        param = dotted_path(tuple(first["loc"])).replace("max_completion_tokens", "max_output_tokens")
        raise BadRequest(f"{param}: {first['msg']}", param=param, code="invalid_value") from exc
    return request, view, NativeBody(RESPONSES, raw)
