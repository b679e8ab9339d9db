"""The OpenAI chat-completions request, validated strictly where the gateway relies on it.

Fields the gateway does not interpret (tools, response_format, logit_bias, seed, ...) pass through to
the engine untouched: the engine validates them. Fields it does interpret are typed here.
"""

from __future__ import annotations

from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError, field_validator

from gateway.errors import BadRequest
from policies.loader import dotted_path

__all__ = ["ChatMessage", "ChatRequest", "parse_chat_request"]

Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    role: Role
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    include_usage: StrictBool = False


class ChatRequest(BaseModel):
    """A validated request. `raw` keeps the client's JSON object, forwarded with only `model`,
    `stream_options` and limits rewritten."""

    model_config = ConfigDict(extra="allow", frozen=True)

    model: str = Field(min_length=1)
    messages: list[ChatMessage] = Field(min_length=1)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    max_tokens: StrictInt | None = Field(default=None, gt=0)
    max_completion_tokens: StrictInt | None = Field(default=None, gt=0)
    n: StrictInt = Field(default=1, ge=1, le=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    logprobs: StrictBool | None = None
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=20)
    user: str | None = None
    metadata: dict[str, str] | None = None

    @field_validator("messages")
    @classmethod
    def _has_user_or_system(cls, messages: list[ChatMessage]) -> list[ChatMessage]:
        if not any(m.role in ("user", "system", "developer") for m in messages):
            raise ValueError("messages must contain at least one user, system or developer message")
        return messages

    @property
    def completion_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def wants_usage_chunk(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


def _apply_limits(request: ChatRequest, raw: dict[str, Any], max_messages: int, max_tokens_cap: int | None) -> None:
    if len(request.messages) > max_messages:
        raise BadRequest(f"messages: {len(request.messages)} messages; the limit is {max_messages}",
                         param="messages", code="too_many_messages")
    limit = request.completion_limit
    if max_tokens_cap is not None and (limit is None or limit > max_tokens_cap):
        field = "max_completion_tokens" if "max_completion_tokens" in raw else "max_tokens"
        raw[field] = max_tokens_cap  # clamped, not refused: the engine stops at the cap


def parse_chat_request(
    body: bytes, max_messages: int = 1024, max_tokens_cap: int | None = None
) -> tuple[ChatRequest, dict[str, Any]]:
    """Parse and validate a request body. Returns the model and the raw JSON object, with the completion
    limit clamped to `max_tokens_cap` when one is set.

    Raises `BadRequest` naming the offending field (`param`) for malformed JSON, a schema violation or
    more than `max_messages` messages.
    """
    try:
        raw = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}", code="invalid_json") from exc
    if not isinstance(raw, dict):
        raise BadRequest("request body must be a JSON object", code="invalid_json")
    try:
        request = ChatRequest.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        param = dotted_path(tuple(first["loc"]))
        raise BadRequest(f"{param}: {first['msg']}", param=param, code="invalid_value") from exc
    _apply_limits(request, raw, max_messages, max_tokens_cap)
    return request, raw
