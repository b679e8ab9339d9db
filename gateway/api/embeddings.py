"""`POST /v1/embeddings` as a raw ASGI endpoint: parse, call the embeddings service, render (the chat routes' frame,
`gateway.api.chat.OpenAIEndpoint`: authentication, ids, access log, trace, errors as the OpenAI envelope)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from starlette.types import Receive

from gateway.api.chat import OpenAIEndpoint, read_body
from gateway.api.runtime import Runtime
from gateway.errors import DeadlineExceeded
from gateway.serving.openai.embeddings_schema import parse_embeddings_request
from gateway.serving.openai.endpoints import EMBEDDINGS
from gateway.serving.sending.forwarding import JSONReply, StreamReply
from gateway.tenancy.api_keys import ApiKey

__all__ = ["EmbeddingsEndpoint"]


class EmbeddingsEndpoint(OpenAIEndpoint):
    """The ASGI app of `/v1/embeddings`, served by `Runtime.embeddings`."""

    def __init__(self, runtime: Callable[[], Runtime]) -> None:
        super().__init__(runtime, EMBEDDINGS)

    async def _handle(self, runtime: Runtime, receive: Receive, headers: dict[str, str], key: ApiKey,
                      request_id: str) -> JSONReply | StreamReply:
        settings = runtime.settings
        request, raw = parse_embeddings_request(await read_body(receive, headers, settings.max_body_bytes))
        runtime.tracing.requested_model(request_id, request.model)
        try:
            async with asyncio.timeout(settings.deadline_s):
                return await runtime.embeddings.handle(request, raw, key.tenant, request_id, key)
        except TimeoutError as exc:
            raise DeadlineExceeded(f"no answer within the gateway's deadline of {settings.deadline_s:g} s; "
                                   "retry later or send fewer inputs") from exc
