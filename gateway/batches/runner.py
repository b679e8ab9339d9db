"""One batch line through the service an interactive request to its url goes through (the chat service: routing, the
tenant's pools, rules, limits, budgets and cache; the embeddings service for `/v1/embeddings`: the tenant's embedding
pool, limits and budgets), tagged as a batch line (`BatchTag`: the lane, the discount, the records' batch id and
custom_id), and its answer as a line of OpenAI's output or error file.

The line's request id is its batch's and index's (`request_id`), the same on every try: the ledger counts a request
id once, so a line answered twice (reclaimed from a worker that died after answering) is billed once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import orjson

from gateway.batches.input import BatchLine
from gateway.batches.lane import BatchLane, LaneBusy, LinePreempted
from gateway.batches.objects import Batch
from gateway.control.policy.policy_holder import PolicyHolder
from gateway.errors import (
    AdmissionUnavailable,
    AuthenticationError,
    BudgetExceeded,
    DeadlineExceeded,
    GatewayError,
    NoReplicaAvailable,
    TooManyRequests,
)
from gateway.serving.embeddings import EmbeddingService
from gateway.serving.openai.embeddings_schema import parse_embeddings_request
from gateway.serving.openai.endpoints import EMBEDDINGS, ENDPOINTS
from gateway.serving.openai.parsing import PARSERS
from gateway.serving.routing.request_context import BatchTag
from gateway.serving.sending.forwarding import JSONReply, StreamReply
from gateway.serving.service import ChatService
from gateway.settings import Settings
from gateway.tenancy.api_keys import ApiKey, KeyStore

__all__ = ["LineOutcome", "LineRunner", "request_id"]

_BY_PATH = {e.path: e for e in ENDPOINTS.values()}
_Send = Callable[[ApiKey | None], Awaitable[JSONReply | StreamReply]]


def request_id(batch_id: str, index: int) -> str:
    return f"req_{batch_id}_{index}"


@dataclass(frozen=True, slots=True)
class LineOutcome:
    """`line`: the output (or error) file's line; `ok`: answered 2xx; `retry`: not answered (no headroom, preempted,
    a rate limit, no replica): the line goes back on the queue and `line` is empty; `tokens`: (input, output) tokens
    of a 2xx answer, as its usage says; `preempted`: retried because an interactive request took the pool back while
    it ran (`gateway.batches.lane`)."""

    line: bytes
    ok: bool
    retry: bool = False
    preempted: bool = False
    tokens: tuple[int, int] = (0, 0)


def output_line(batch_id: str, line: BatchLine, status: int, body: Any, request: str) -> bytes:
    """OpenAI's output file line: the response's status, request id and body."""
    return orjson.dumps({"id": f"batch_req_{batch_id.removeprefix('batch_')}_{line.index}", "custom_id": line.custom_id,
                         "response": {"status_code": status, "request_id": request, "body": body}, "error": None})


def _error_body(exc: GatewayError) -> Any:
    return orjson.loads(exc.body())


class LineRunner:
    """Shares, does not own, the chat and embeddings services, the policy holder, the lane and the key store.
    `transient(exc)`: whether a refusal is one to try the line again for (the default: no headroom, preempted, a
    rate limit, limits unavailable, no replica). `keys`: where the issued key that created a batch is looked up for
    each line (its limits, budget and id on the records apply; revoked or expired since, the line is refused with
    401); None: no issued keys."""

    def __init__(self, service: ChatService, embeddings: EmbeddingService, policies: PolicyHolder, settings: Settings,
                 lane: BatchLane | None, transient: Callable[[GatewayError], bool] | None = None,
                 keys: KeyStore | None = None) -> None:
        self._keys = keys
        self._service = service
        self._embeddings = embeddings
        self._policies = policies
        self._settings = settings
        self._lane = lane
        self._transient = transient or _transient

    async def run(self, batch: Batch, line: BatchLine) -> LineOutcome:
        rid = request_id(batch.id, line.index)
        try:
            body = await self._answer(batch, line, rid)
        except GatewayError as exc:
            if self._transient(exc):
                return LineOutcome(b"", False, retry=True, preempted=isinstance(exc, LinePreempted))
            return LineOutcome(output_line(batch.id, line, exc.status, _error_body(exc), rid), False)
        finally:
            if self._lane is not None:
                self._lane.leave(rid)
        answer = orjson.loads(body)
        return LineOutcome(output_line(batch.id, line, 200, answer, rid), True, tokens=_tokens(answer))

    async def _answer(self, batch: Batch, line: BatchLine, rid: str) -> bytes:
        send = self._send(batch, line, rid)
        settings = self._settings
        wait_s = self._policies.current.policy.batches.max_wait_s
        key = await self._key(batch)
        try:
            async with asyncio.timeout(settings.deadline_s + wait_s):
                reply = await (send(key) if self._lane is None else self._lane.preemptible(rid, send(key)))
        except TimeoutError as exc:
            raise DeadlineExceeded(f"no answer within the gateway's deadline of {settings.deadline_s:g} s") from exc
        assert isinstance(reply, JSONReply)  # no line streams (refused in `_send`)
        return reply.body

    def _send(self, batch: Batch, line: BatchLine, rid: str) -> _Send:
        """The line's body parsed as its url's endpoint parses it (a body it refuses raises its 400), and the call
        of that endpoint's service that answers it under a key."""
        tag, body = BatchTag(batch.id, line.custom_id), orjson.dumps(line.body)
        if line.url == EMBEDDINGS.path:
            request, raw = parse_embeddings_request(body)
            return lambda key: self._embeddings.handle(request, raw, batch.tenant, rid, key, batch=tag)
        endpoint = _BY_PATH.get(line.url)
        if endpoint is None:  # the input's check takes only the Batch API's urls, all served here
            raise _NoEndpoint(f"Invalid URL (POST {line.url}): this gateway does not serve it", code="invalid_url")
        if line.body.get("stream"):
            raise _Refused("a batch line cannot stream: remove `stream` from its body", param="stream")
        chat, raw_chat, native = PARSERS[endpoint.name](body, self._settings.max_messages,
                                                        self._settings.max_tokens_cap)
        return lambda key: self._service.handle(chat, raw_chat, batch.tenant, rid, {}, native, key=key, batch=tag)

    async def _key(self, batch: Batch) -> ApiKey | None:
        """The key that created `batch`, as its lines are sent under it."""
        if batch.key_source == "policy":
            return ApiKey(batch.key_id, batch.tenant, source="policy")
        if batch.key_source != "issued" or self._keys is None:
            return None
        key = await self._keys.by_id(batch.key_id)
        why = "gone" if key is None else key.refusal(time.time())
        if key is None or why is not None:
            raise AuthenticationError(f"API key {batch.key_id}, which created this batch, is {why}")
        return key if key.tenant == batch.tenant else replace(key, tenant=batch.tenant)  # an open policy's caller


class _NoEndpoint(GatewayError, status=404, type="invalid_request_error"):
    """A line whose url no endpoint of this gateway serves."""


class _Refused(GatewayError, status=400, type="invalid_request_error"):
    """A line this gateway will not run as a batch line (one that asks to stream)."""


def _tokens(answer: Any) -> tuple[int, int]:
    """(input, output) tokens of an answer's usage: chat and completions (`prompt_tokens`, `completion_tokens`) or
    Responses (`input_tokens`, `output_tokens`); 0 where it has none."""
    usage = answer.get("usage") if isinstance(answer, dict) else None
    if not isinstance(usage, dict):
        return 0, 0
    given = (usage.get("prompt_tokens", usage.get("input_tokens")),
             usage.get("completion_tokens", usage.get("output_tokens")))
    return (given[0] if isinstance(given[0], int) else 0), (given[1] if isinstance(given[1], int) else 0)


def _transient(exc: GatewayError) -> bool:
    if isinstance(exc, BudgetExceeded):
        return False  # spent: OpenAI answers such a line with its error, and so does the gateway
    return isinstance(exc, LaneBusy | LinePreempted | TooManyRequests | AdmissionUnavailable | NoReplicaAvailable)
