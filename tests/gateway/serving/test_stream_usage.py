"""A stream is billed on its final usage: the engine is asked for one usage event whatever the client's
stream_options say, and a relay fed running totals (vLLM's continuous_usage_stats, or a server that reports usage on
every chunk) keeps the last one, without dropping the content those chunks carry."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

from gateway.serving.openai.endpoints import COMPLETIONS, NativeBody, native_upstream
from gateway.serving.openai.schema import ChatRequest
from gateway.serving.openai.upstream import prepare_upstream
from gateway.serving.sending.streaming import StreamRelay
from policies.decide import RouteDecision
from policies.ladder import LadderState

DECISION = RouteDecision("micro", "micro-model", None, "pinned", "", "1")


def _chunk(text: str, completion_tokens: int) -> bytes:
    return (b'data: {"choices":[{"index":0,"delta":{"content":"' + text.encode() + b'"}}],"usage":{"prompt_tokens":5,'
            b'"completion_tokens":' + str(completion_tokens).encode() + b',"total_tokens":0}}\n\n')


async def _engine() -> AsyncIterator[bytes]:
    yield _chunk("a", 1)
    yield _chunk("b", 2) + _chunk("c", 3)
    yield (b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}\n\n'
           b"data: [DONE]\n\n")


def test_running_usage_totals_bill_the_last_and_keep_the_content() -> None:
    relay = StreamRelay(b"", _engine(), AsyncExitStack(), False, 0.0, lambda _: None)

    async def read() -> bytes:
        return b"".join([chunk async for chunk in relay.body()])

    body = asyncio.run(read())
    assert relay.usage is not None and (relay.usage.prompt_tokens, relay.usage.completion_tokens) == (5, 3)
    assert relay.generated_text() == "abc" and body.count(b'"content":"') == 3  # no content chunk dropped
    assert b'"choices":[]' not in body  # the usage-only event: the client did not ask for it


def test_the_engine_is_asked_for_one_usage_event_whatever_the_client_sent() -> None:
    raw = {"model": "micro", "messages": [{"role": "user", "content": "hi"}], "stream": True,
           "stream_options": {"include_usage": False, "continuous_usage_stats": True}}
    upstream, _ = prepare_upstream(raw, DECISION, ChatRequest.model_validate(raw), LadderState())
    assert upstream["stream_options"] == {"include_usage": True}
    native = NativeBody(COMPLETIONS, {"prompt": "hi", "stream": True,
                                      "stream_options": {"continuous_usage_stats": True}})
    upstream, _ = native_upstream(native, DECISION, True, LadderState())
    assert upstream["stream_options"] == {"include_usage": True}
