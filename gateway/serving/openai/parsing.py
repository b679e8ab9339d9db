"""Each endpoint's request parser: the client's body in, the request's routing view (and its native body) out.

The HTTP endpoints (`gateway.api.chat`) and the batch lines (`gateway.batches`) parse with the same functions, so a
line is refused for what the endpoint would refuse.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.serving.openai.completions_schema import parse_completions_request
from gateway.serving.openai.endpoints import CHAT, COMPLETIONS, RESPONSES, NativeBody
from gateway.serving.openai.responses_schema import parse_responses_request
from gateway.serving.openai.schema import ChatRequest, parse_chat_request

__all__ = ["PARSERS", "Parsed", "Parser"]

Parsed = tuple[ChatRequest, dict[str, Any], NativeBody | None]
Parser = Callable[[bytes, int, "int | None"], Parsed]
"""`(body, max_messages, max_tokens_cap)` -> the request's view, its raw view and its native body; raises
`gateway.errors.BadRequest` for a body the endpoint refuses."""


def _parse_chat(body: bytes, max_messages: int, max_tokens_cap: int | None) -> Parsed:
    return (*parse_chat_request(body, max_messages, max_tokens_cap), None)


PARSERS: dict[str, Parser] = {CHAT.name: _parse_chat, RESPONSES.name: parse_responses_request,
                              COMPLETIONS.name: parse_completions_request}
"""By endpoint name (`Endpoint.name`)."""
