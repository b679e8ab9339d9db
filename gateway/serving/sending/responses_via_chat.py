"""Forward a Responses request to a chat-only pool (`responses: chat`): translated both ways
(`gateway.serving.sending.responses_chat`), accounted as a Responses request (its ledger record says `responses`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson

from backends.clients.pool import Pool
from gateway.serving.openai.endpoints import CHAT, RESPONSES, NativeBody
from gateway.serving.openai.schema import ChatRequest
from gateway.serving.records.accounting import RequestFacts
from gateway.serving.sending.forwarding import Forwarder, JSONReply, StreamReply
from gateway.serving.sending.responses_chat import ChatToResponsesStream, chat_request, response_object
from policies.loader import LoadedPolicy
from policies.pools import RemotePool

__all__ = ["send_via_chat", "translated"]


def translated(loaded: LoadedPolicy, pool: str, native: NativeBody | None) -> bool:
    """Whether a request for `pool` must be translated: a Responses request for a remote pool that speaks chat
    completions only."""
    spec = loaded.policy.pools.get(pool)
    return native is not None and native.endpoint is RESPONSES and isinstance(spec, RemotePool) and (
        spec.responses == "chat")


async def send_via_chat(fw: Forwarder, pool: Pool, upstream: dict[str, Any], request: ChatRequest,
                        facts: RequestFacts, loaded: LoadedPolicy, headers: dict[str, str]) -> JSONReply | StreamReply:
    """`upstream`: the Responses body for the pool (its `model` set). A usage the engine did not report is counted
    from it, as for a native Responses request."""
    chat = chat_request(upstream, facts.decision.pool)
    if not request.stream:
        replica, body = await fw.complete(pool, orjson.dumps(chat), CHAT.path, facts.started)
        fw.account_json(loaded, facts, replica, upstream, body)
        return JSONReply(response_object(upstream, body), facts.decision, headers)
    opened = await fw.open(pool, orjson.dumps(chat), CHAT.path)
    events = ChatToResponsesStream(upstream, opened.first_chunk, opened.chunks).events()
    return fw.relay(replace(opened, chunks=events), b"", upstream, request, facts, loaded, headers)
