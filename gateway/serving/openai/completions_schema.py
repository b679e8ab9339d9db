"""The legacy completions request (`POST /v1/completions`): parsed into the chat path's routing view.

The gateway reads `model`, `prompt` (a string, a list of strings, a token array or a list of token arrays),
`stream`, `stream_options`, `max_tokens`, `n`, `temperature`, `top_p`, `user`; the rest (`echo`, `logprobs`,
`suffix`, `best_of`, ...) passes through to the engine, which validates it. The prompt's text is scored as one user
turn; a token-array prompt has no text for the scorer or the length rules (it is routed on an empty text and its
tokens are priced from the engine's usage like any other).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import ConfigDict, Field, StrictBool, StrictInt, ValidationError

from gateway.errors import BadRequest
from gateway.serving.openai.endpoints import COMPLETIONS, NativeBody
from gateway.serving.openai.schema import ChatRequest, NullIsUnset, StreamOptions, json_object
from policies.loader import dotted_path

__all__ = ["CompletionsRequest", "parse_completions_request", "prompt_parts"]


_TokenId = Annotated[StrictInt, Field(ge=0)]


class CompletionsRequest(NullIsUnset):
    """The fields of a completions request the gateway reads (the published request schema)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    model: str = Field(min_length=1)
    prompt: str | Annotated[list[str], Field(min_length=1)] | Annotated[list[_TokenId], Field(min_length=1)] | (
        Annotated[list[Annotated[list[_TokenId], Field(min_length=1)]], Field(min_length=1)])
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    max_tokens: StrictInt | None = Field(default=None, gt=0)
    n: StrictInt = Field(default=1, ge=1, le=128)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    user: str | None = None


def _tokens(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(type(t) is int and t >= 0 for t in value)


def prompt_parts(prompt: Any) -> tuple[list[str], int] | None:
    """The prompt's texts and its count of given token ids; None when `prompt` is none of the four forms."""
    if isinstance(prompt, str):
        return [prompt], 0
    if _tokens(prompt):
        return [], len(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return list(prompt), 0
    if isinstance(prompt, list) and prompt and all(_tokens(p) for p in prompt):
        return [], sum(len(p) for p in prompt)
    return None


def _prompts(raw: dict[str, Any]) -> tuple[list[str], int]:
    if "prompt" not in raw or raw["prompt"] is None:
        raise BadRequest("prompt: required", param="prompt", code="missing_required_parameter")
    parts = prompt_parts(raw["prompt"])
    if parts is None:
        raise BadRequest("prompt: must be a string, a list of strings, a list of token ids or a list of such lists",
                         param="prompt", code="invalid_value")
    return parts


def _view(raw: dict[str, Any], texts: Sequence[str]) -> dict[str, Any]:
    view: dict[str, Any] = {"model": raw.get("model"), "messages": [{"role": "user", "content": "\n".join(texts)}]}
    for name in ("stream", "stream_options", "max_tokens", "n", "temperature", "top_p", "user"):
        if raw.get(name) is not None:
            view[name] = raw[name]
    return view


def parse_completions_request(body: bytes, max_messages: int = 1024, max_tokens_cap: int | None = None,
                              ) -> tuple[ChatRequest, dict[str, Any], NativeBody]:
    """Validate a completions request body. Returns the routing view (a `ChatRequest` and its dict) and the body
    the engine is sent (`max_tokens` clamped to `max_tokens_cap` when one is set). Raises `BadRequest` naming the
    offending field. `max_messages` bounds the number of prompts in a batch."""
    raw = json_object(body)
    texts, _ = _prompts(raw)
    raw = {k: v for k, v in raw.items() if v is not None or k not in CompletionsRequest.model_fields}
    prompt = raw["prompt"]
    batch = len(prompt) if isinstance(prompt, list) and not _tokens(prompt) else 1
    if batch > max_messages:
        raise BadRequest(f"prompt: {batch} prompts; the limit is {max_messages}", param="prompt",
                         code="too_many_messages")
    try:
        CompletionsRequest.model_validate(raw)
        request = ChatRequest.model_validate(_view(raw, texts))
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        param = dotted_path(tuple(first["loc"]))
        raise BadRequest(f"{param}: {first['msg']}", param=param, code="invalid_value") from exc
    limit = request.max_tokens
    if max_tokens_cap is not None and (limit is None or limit > max_tokens_cap):
        raw["max_tokens"] = max_tokens_cap  # clamped, not refused: the engine stops at the cap
        request = request.model_copy(update={"max_tokens": max_tokens_cap})
    return request, _view(raw, texts), NativeBody(COMPLETIONS, raw)
