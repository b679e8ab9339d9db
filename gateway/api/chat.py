"""`POST /v1/chat/completions`, `/v1/responses` and `/v1/completions` as raw ASGI endpoints: the hot path.

It skips Starlette's request objects and middleware stack (measured: a tenth of the gateway's CPU per
request), and does exactly what a Starlette handler would: parse, call the service, render, with every
error as the OpenAI envelope and never a stack trace. The three endpoints differ only in their parser
(`gateway.serving.openai.endpoints`): the same service routes, admits, prices and records them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import AsyncGenerator, Callable

from starlette.types import Receive, Scope, Send

from gateway.api.auth import key_id
from gateway.api.body_limit import BodyLimit
from gateway.api.runtime import Runtime
from gateway.errors import DeadlineExceeded, GatewayError, error_body
from gateway.serving.openai.endpoints import CHAT, COMPLETIONS, RESPONSES, Endpoint
from gateway.serving.openai.parsing import PARSERS
from gateway.serving.sending.forwarding import JSONReply, StreamReply
from gateway.serving.sending.streaming import SSEResponse
from gateway.tenancy.api_keys import ApiKey
from policies.decide import RouteDecision, route_text
from policies.tiers import estimates_text

__all__ = ["ChatEndpoint", "OpenAIEndpoint", "endpoint_apps", "read_body"]

log = logging.getLogger("cascade.gateway")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_JSON_TYPE = (b"content-type", b"application/json")


class _Disconnected(Exception):
    pass


def route_headers(request_id: str, decision: RouteDecision, endpoint: str = CHAT.name) -> dict[str, str]:
    """The decision as response headers; `x-cascade-tiers` (every tier's predicted quality and expected cost,
    `policies.tiers.estimates_text`) only where a tiers policy predicted them."""
    tiers = {"x-cascade-tiers": estimates_text(decision.trade.estimates)} if decision.trade is not None else {}
    return tiers | {
        "x-request-id": request_id,
        "x-cascade-endpoint": endpoint,
        "x-cascade-pool": decision.pool,
        "x-cascade-score": "none" if decision.score is None else f"{decision.score:.4f}",
        "x-cascade-scored-by": decision.scored_by or "none",
        "x-cascade-in-domain": "none" if decision.in_domain is None else f"{decision.in_domain:.4f}",
        "x-cascade-router-version": decision.router_version or "none",
        "x-cascade-pool-version": decision.pool_version or "none",
        "x-cascade-rule": decision.rule,
        "x-cascade-route": route_text(decision.route),
        "x-cascade-policy-version": decision.policy_version,
    }


async def read_body(receive: Receive, headers: dict[str, str], limit: int) -> bytes:
    """The request's body read from the ASGI `receive` channel, at most `limit` bytes (`BodyLimit`)."""
    bound = BodyLimit(limit)
    bound.check_declared(headers)
    return await bound.read(_chunks(receive))


async def _chunks(receive: Receive) -> AsyncGenerator[bytes]:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        yield message.get("body", b"")
        if not message.get("more_body", False):
            return


async def _send(send: Send, status: int, body: bytes, headers: dict[str, str]) -> None:
    raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    raw.append(_JSON_TYPE)
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


async def _send_error(send: Send, exc: GatewayError, request_id: str) -> None:
    await _send(send, exc.status, exc.body(), {"x-request-id": request_id, **exc.headers()})


class OpenAIEndpoint:
    """The ASGI app of one OpenAI route: authentication, request id, access log, trace, the routing headers and
    every error as the OpenAI envelope; `_handle` (a subclass's) reads the body and calls its service. `runtime()`
    gives the running `Runtime` (built by the lifespan)."""

    def __init__(self, runtime: Callable[[], Runtime], endpoint: Endpoint) -> None:
        self._runtime = runtime
        self._endpoint = endpoint
        self._id_prefix = f"req_{endpoint.id_tag}_" if endpoint.id_tag else "req_"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        runtime = self._runtime()
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        # Always our own id: it is the ledger's idempotency key, so a client must not be able to choose it
        # (reusing one would make every later request free). The client's id is echoed for tracing.
        request_id = self._id_prefix + os.urandom(12).hex()
        tenant, started, access = "unknown", time.monotonic(), runtime.access_log
        access.begin(request_id, key_id(headers.get("authorization")), self._endpoint.name)
        runtime.tracing.begin(request_id, headers, self._endpoint.name)
        try:
            client = scope.get("client")
            key = await runtime.keys.identify(runtime.policies.current.policy, headers.get("authorization"),
                                              client[0] if client else None)
            tenant = key.tenant
            reply = await self._handle(runtime, receive, headers, key, request_id)
        except GatewayError as exc:
            runtime.metrics.observe_rejected(exc.status, tenant)
            access.refused(request_id, tenant, exc.status, exc.code or exc.type, started)
            runtime.tracing.refused(request_id, tenant, exc.status, exc.code or exc.type)
            return await _send_error(send, exc, request_id)
        except _Disconnected:
            access.refused(request_id, tenant, 499, "client_disconnect", started)  # nginx's code: no response
            runtime.tracing.refused(request_id, tenant, 499, "client_disconnect")
            return None
        except Exception:
            access.refused(request_id, tenant, 500, "internal_error", started)
            runtime.tracing.refused(request_id, tenant, 500, "internal_error")
            log.exception("unhandled error", extra={"request_id": request_id})
            body = error_body("internal gateway error; see the gateway log", "internal_error")
            return await _send(send, 500, body, {"x-request-id": request_id})
        out = {**route_headers(request_id, reply.decision, self._endpoint.name), **reply.headers}
        given = headers.get("x-request-id", "")
        if _REQUEST_ID.match(given):
            out["x-client-request-id"] = given
        if isinstance(reply, JSONReply):
            return await _send(send, 200, reply.body, out)
        await SSEResponse(reply.relay.body(), out)(scope, receive, send)

    async def _handle(self, runtime: Runtime, receive: Receive, headers: dict[str, str], key: ApiKey,
                      request_id: str) -> JSONReply | StreamReply:
        raise NotImplementedError


class ChatEndpoint(OpenAIEndpoint):
    """The ASGI app of one of the generative routes (`endpoint`: chat unless said), served by the chat service."""

    def __init__(self, runtime: Callable[[], Runtime], endpoint: Endpoint = CHAT) -> None:
        super().__init__(runtime, endpoint)
        self._parse = PARSERS[endpoint.name]

    async def _handle(self, runtime: Runtime, receive: Receive, headers: dict[str, str], key: ApiKey,
                      request_id: str) -> JSONReply | StreamReply:
        settings = runtime.settings
        body = await read_body(receive, headers, settings.max_body_bytes)
        chat, raw, native = self._parse(body, settings.max_messages, settings.max_tokens_cap)
        runtime.tracing.requested_model(request_id, chat.model)
        try:
            async with asyncio.timeout(settings.deadline_s):
                return await runtime.service.handle(chat, raw, key.tenant, request_id, headers, native, key=key)
        except TimeoutError as exc:
            raise DeadlineExceeded(f"no answer within the gateway's deadline of {settings.deadline_s:g} s; "
                                   "retry later or lower max_tokens") from exc


def endpoint_apps(runtime: Callable[[], Runtime]) -> dict[str, ChatEndpoint]:
    """The ASGI app of each generative OpenAI route, by path."""
    return {e.path: ChatEndpoint(runtime, e) for e in (CHAT, RESPONSES, COMPLETIONS)}
