"""The embeddings request (`POST /v1/embeddings`), validated where the gateway relies on it.

The gateway reads `model`, `input` (a string, a list of strings, a token array or a list of token arrays, as the
OpenAI API takes it: no empty string, no empty list, at most `MAX_INPUTS` inputs), `encoding_format` (`float` or
`base64`) and `dimensions` (passed on: an engine whose model cannot shorten its vectors refuses it with its own 400);
the rest (`user`, vLLM's `truncate_prompt_tokens`, ...) passes through to the engine untouched. `null` is a field not
sent, as on every endpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, StrictInt, StrictStr, ValidationError

from gateway.errors import BadRequest
from gateway.serving.openai.schema import NullIsUnset, json_object
from policies.context import estimate_tokens
from policies.loader import dotted_path

__all__ = ["MAX_INPUTS", "SPECIAL_TOKENS", "EmbeddingsInput", "EmbeddingsRequest", "input_of",
           "parse_embeddings_request"]

MAX_INPUTS = 2048
"""Inputs in one request at most (the OpenAI API's bound)."""
SPECIAL_TOKENS = 2
"""Tokens a tokenizer may add to each input besides its text's (a begin and an end marker)."""

_TokenId = Annotated[StrictInt, Field(ge=0)]
_Text = Annotated[StrictStr, Field(min_length=1)]
_Tokens = Annotated[list[_TokenId], Field(min_length=1)]


class EmbeddingsRequest(NullIsUnset):
    """The fields of an embeddings request the gateway reads (the published request schema)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    model: str = Field(min_length=1)
    input: _Text | Annotated[list[_Text], Field(min_length=1, max_length=MAX_INPUTS)] | _Tokens | Annotated[
        list[_Tokens], Field(min_length=1, max_length=MAX_INPUTS)]
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: StrictInt | None = Field(default=None, ge=1)
    user: str | None = None


@dataclass(frozen=True, slots=True)
class EmbeddingsInput:
    """What admission needs of a request's input: `count` inputs; `tokens`, their estimate (exact for token
    arrays, 4 characters a token for text); `bounds`, the most tokens each input can be (a token array's length; a
    text's UTF-8 bytes plus `SPECIAL_TOKENS`: a byte-level tokenizer spends at least one byte a token), before any
    cap by the pool's context."""

    count: int
    tokens: int
    bounds: tuple[int, ...]

    def held(self, context: int | None) -> int:
        """The worst case of the input's tokens on a pool whose engines hold `context` tokens (None: unknown):
        each input at most its bound and at most the context (the engine refuses a longer one)."""
        return sum(b if context is None else min(b, context) for b in self.bounds)


def _inputs(value: Any) -> list[str | list[int]]:
    """The request's inputs, one per embedding answered."""
    if isinstance(value, str) or (value and isinstance(value[0], int)):
        return [value]
    return list(value)


def input_of(request: EmbeddingsRequest) -> EmbeddingsInput:
    """The size of `request`'s input (see `EmbeddingsInput`)."""
    inputs = _inputs(request.input)
    tokens = sum(estimate_tokens(i) if isinstance(i, str) else len(i) for i in inputs)
    bounds = tuple((len(i.encode()) + SPECIAL_TOKENS) if isinstance(i, str) else len(i) for i in inputs)
    return EmbeddingsInput(len(inputs), tokens, bounds)


def parse_embeddings_request(body: bytes) -> tuple[EmbeddingsRequest, dict[str, Any]]:
    """Validate an embeddings request body. Returns the request and the body the engine is sent (the client's, with
    the `null`s of the fields read here left out). Raises `BadRequest` naming the offending field (`param`)."""
    raw = json_object(body)
    raw = {k: v for k, v in raw.items() if v is not None or k not in EmbeddingsRequest.model_fields}
    if "input" not in raw:
        raise BadRequest("input: required", param="input", code="missing_required_parameter")
    try:
        request = EmbeddingsRequest.model_validate(raw)
    except ValidationError as exc:
        raise _refusal(exc) from exc
    return request, raw


def _refusal(exc: ValidationError) -> BadRequest:
    """The first problem, as the OpenAI API words an `input` it cannot take (pydantic lists one error per form of
    the union: which form was meant is the caller's guess, so the message names the four)."""
    first = exc.errors(include_url=False)[0]
    loc = tuple(first["loc"])
    if loc[:1] != ("input",):
        param = dotted_path(loc)
        return BadRequest(f"{param}: {first['msg']}", param=param, code="invalid_value")
    return BadRequest("input: must be a non-empty string, a list of at most 2048 non-empty strings, a non-empty "
                      "list of token ids (integers >= 0) or a list of at most 2048 such lists", param="input",
                      code="invalid_value")
