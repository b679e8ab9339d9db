"""The OpenAI chat-completions request, validated strictly where the gateway relies on it.

Fields the gateway does not interpret (tools, response_format, logit_bias, seed, ...) pass through to
the engine untouched: the engine validates them. Fields it does interpret are typed here, and refused only
where the OpenAI API refuses them too: `null` means "not set" for every optional field (the default applies),
`n` may ask for several choices, and a conversation may hold only assistant or tool turns.
"""

from __future__ import annotations

from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError, model_validator

from gateway.checking.schemas import check_request_schemas
from gateway.errors import BadRequest
from policies.loader import dotted_path

__all__ = ["ChatMessage", "ChatRequest", "NullIsUnset", "StreamOptions", "json_object", "parse_chat_request"]

Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


class NullIsUnset(BaseModel):
    """`null` for a field is the field not sent: its default applies (the OpenAI API declares its optional
    fields nullable; a typed default such as `stream: false` must not turn `null` into a refusal)."""

    @model_validator(mode="before")
    @classmethod
    def _drop_nulls(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        return {k: v for k, v in data.items() if v is not None or not _optional(cls, k)}


def _optional(model: type[BaseModel], name: str) -> bool:
    field = model.model_fields.get(name)
    return field is not None and not field.is_required()


class ChatMessage(NullIsUnset):
    model_config = ConfigDict(extra="allow", frozen=True)

    role: Role
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None


class StreamOptions(NullIsUnset):
    model_config = ConfigDict(extra="allow", frozen=True)

    include_usage: StrictBool = False


class ChatRequest(NullIsUnset):
    """A validated request. `raw` keeps the client's JSON object, forwarded with only `model`,
    `stream_options` and limits rewritten (and the `null`s of the fields typed here left out)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    model: str = Field(min_length=1)
    messages: list[ChatMessage] = Field(min_length=1)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    max_tokens: StrictInt | None = Field(default=None, gt=0)
    max_completion_tokens: StrictInt | None = Field(default=None, gt=0)
    n: StrictInt = Field(default=1, ge=1, le=128, description="choices asked for (the OpenAI API's bounds)")
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    logprobs: StrictBool | None = None
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=20)
    user: str | None = None
    metadata: dict[str, str] | None = None

    @property
    def completion_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def wants_usage_chunk(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


def _apply_limits(request: ChatRequest, raw: dict[str, Any], max_messages: int,
                  max_tokens_cap: int | None) -> ChatRequest:
    """`request` as the gateway reads it (its completion limit clamped to the cap: what admission holds); `raw`
    clamped in place (what the engine is sent)."""
    if len(request.messages) > max_messages:
        raise BadRequest(f"messages: {len(request.messages)} messages; the limit is {max_messages}",
                         param="messages", code="too_many_messages")
    limit = request.completion_limit
    if max_tokens_cap is None or (limit is not None and limit <= max_tokens_cap):
        return request
    field = "max_completion_tokens" if "max_completion_tokens" in raw else "max_tokens"
    raw[field] = max_tokens_cap  # clamped, not refused: the engine stops at the cap
    return request.model_copy(update={field: max_tokens_cap})


def json_object(body: bytes) -> dict[str, Any]:
    """A request body that must be one JSON object (every endpoint's); `BadRequest` (invalid_json) otherwise."""
    try:
        raw = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}", code="invalid_json") from exc
    if not isinstance(raw, dict):
        raise BadRequest("request body must be a JSON object", code="invalid_json")
    return raw


def parse_chat_request(
    body: bytes, max_messages: int = 1024, max_tokens_cap: int | None = None
) -> tuple[ChatRequest, dict[str, Any]]:
    """Parse and validate a request body. Returns the model and the raw JSON object, with the completion
    limit clamped to `max_tokens_cap` when one is set.

    Raises `BadRequest` naming the offending field (`param`) for malformed JSON, a schema violation, more than
    `max_messages` messages, or a `response_format` / tool schema that is not a valid JSON Schema.
    """
    raw = json_object(body)
    # The engine sees what the gateway understood: a `null` the gateway read as its default is not sent.
    raw = {k: v for k, v in raw.items() if v is not None or not _optional(ChatRequest, k)}
    try:
        request = ChatRequest.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        param = dotted_path(tuple(first["loc"]))
        raise BadRequest(f"{param}: {first['msg']}", param=param, code="invalid_value") from exc
    request = _apply_limits(request, raw, max_messages, max_tokens_cap)
    check_request_schemas(raw)
    return request, raw
