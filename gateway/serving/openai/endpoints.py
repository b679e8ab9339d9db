"""The OpenAI endpoints the gateway serves, and what differs between the three generative ones on the request path.

Every generative endpoint is routed, admitted, priced and recorded by the one chat path (`gateway.serving.service`): its
request is parsed into a `ChatRequest` *view* (the text the router scores as messages, the completion limit, the
stream flag) and, for the Responses and completions endpoints, a `NativeBody`: the client's own body, which is what
the engine is sent (on the engine's own path, `Endpoint.path`) with only `model` (and the completions stream's
`include_usage`) rewritten. The chat endpoint's view is its body, so it has no `NativeBody`.

What stays chat-only, by design, is data on the endpoint (`Endpoint`'s capabilities): the true cascade (its
confidence is read from chat logprobs), the ladder's context truncation (it cuts chat messages) and its force_stream
step (it assembles a chat answer), the response cache (its key is the chat body), the output checks (they read chat
answers), the input guards' redaction, and the learning tap.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.serving.openai.upstream import BILLED_STREAM_OPTIONS
from policies.decide import RouteDecision
from policies.ladder import LadderState

__all__ = ["CHAT", "COMPLETIONS", "EMBEDDINGS", "ENDPOINTS", "RESPONSES", "Endpoint", "NativeBody", "endpoint_of",
           "native_upstream"]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """`name` is what the ledger's `endpoint` field, the `x-cascade-endpoint` header and the metrics say; `path`
    is the client's path and the engine's (the gateway serves the OpenAI paths the engines serve); `id_tag` marks
    the request ids of the endpoint (`req_<tag>_...`; "" for chat, whose ids stay `req_...`). The rest say what the
request path does for the endpoint's requests: cascade them, let the ladder truncate their context or stream them
for a JSON answer (`force_stream`), answer them from the response cache, judge their answers (output checks), let the
input guards rewrite their prompts (`redaction`), show them to the learning tap."""

    name: str
    path: str
    id_tag: str
    cascade: bool = False
    truncation: bool = False
    force_stream: bool = False
    cache: bool = False
    checks: bool = False
    redaction: bool = False
    learning: bool = False


CHAT = Endpoint("chat", "/v1/chat/completions", "", cascade=True, truncation=True, force_stream=True, cache=True,
                checks=True, redaction=True, learning=True)
RESPONSES = Endpoint("responses", "/v1/responses", "resp")
COMPLETIONS = Endpoint("completions", "/v1/completions", "cmpl")
ENDPOINTS: Mapping[str, Endpoint] = {e.name: e for e in (CHAT, RESPONSES, COMPLETIONS)}
EMBEDDINGS = Endpoint("embeddings", "/v1/embeddings", "embd")
"""Not one of the chat path's `ENDPOINTS`: embedding pools serve it, through a service of its own
(`gateway.serving.embeddings`)."""


@dataclass(frozen=True, slots=True)
class NativeBody:
    """A non-chat request as the client sent it (limits clamped by the parser)."""

    endpoint: Endpoint
    body: dict[str, Any]


def endpoint_of(native: NativeBody | None) -> Endpoint:
    """The endpoint of a request: chat, or a native body's."""
    return CHAT if native is None else native.endpoint


def native_upstream(native: NativeBody, decision: RouteDecision, stream: bool,
                    ladder: LadderState) -> tuple[dict[str, Any], dict[str, str]]:
    """The engine's body for a non-chat request routed by `decision`, and the ladder's response headers. A
    streamed completion always asks for the usage chunk (the relay hides it from a client that did not ask); a
    streamed Responses request needs nothing: usage comes in its `response.completed` event."""
    upstream = dict(native.body, model=decision.model)
    if stream and native.endpoint is COMPLETIONS:
        upstream["stream_options"] = dict(BILLED_STREAM_OPTIONS)
    extra = {"x-cascade-degraded": ",".join(ladder.names)} if ladder.active else {}
    return upstream, extra
