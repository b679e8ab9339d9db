"""The SSE relay's accounting of how a stream ended: complete, client gone, or engine failed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, MutableMapping
from contextlib import AsyncExitStack
from typing import Any

from gateway.serving.sending.streaming import COMPLETIONS_STREAM, SSEResponse, StreamRelay

_CHUNK = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
_USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}\n\n'
_DONE = b"data: [DONE]\n\n"


async def _engine(chunks: list[bytes], then_hang: bool) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk
    if then_hang:  # an engine that keeps the connection open after [DONE]
        await asyncio.Event().wait()


def _relay(chunks: list[bytes], then_hang: bool, finished: list[StreamRelay]) -> StreamRelay:
    return StreamRelay(b"", _engine(chunks, then_hang), AsyncExitStack(), True, 0.0, finished.append)


async def _serve(relay: StreamRelay, leave_after_done: bool) -> list[bytes]:
    """Run the response with a client that disconnects as soon as it has read `[DONE]` (or never)."""
    sent: list[bytes] = []
    done = asyncio.Event()

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message.get("body", b""))
        if _DONE in message.get("body", b""):
            done.set()

    async def receive() -> dict[str, Any]:
        if leave_after_done:
            await done.wait()
            return {"type": "http.disconnect"}
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    await asyncio.wait_for(SSEResponse(relay.body(), {})({}, receive, send), timeout=5)
    return sent


def test_a_client_leaving_right_after_done_is_a_completed_request() -> None:
    finished: list[StreamRelay] = []
    relay = _relay([_CHUNK, _USAGE, _DONE], then_hang=True, finished=finished)
    sent = asyncio.run(_serve(relay, leave_after_done=True))
    assert finished == [relay]
    assert (relay.completed, relay.disconnected) == (True, False)
    assert relay.usage is not None and relay.usage.completion_tokens == 1
    assert _DONE in b"".join(sent)


def _leave_mid_stream(relay: StreamRelay) -> None:
    """Run the response with a client that disconnects 0.05 s in, while the engine hangs."""

    async def run() -> None:
        async def send(message: MutableMapping[str, Any]) -> None:
            pass

        async def receive() -> dict[str, Any]:
            await asyncio.sleep(0.05)
            return {"type": "http.disconnect"}

        await asyncio.wait_for(SSEResponse(relay.body(), {})({}, receive, send), timeout=5)

    asyncio.run(run())


def test_a_client_leaving_mid_stream_is_a_disconnect() -> None:
    finished: list[StreamRelay] = []
    relay = _relay([_CHUNK], then_hang=True, finished=finished)
    _leave_mid_stream(relay)
    assert finished == [relay]
    assert (relay.completed, relay.disconnected) == (False, True)
    assert relay.generated_text() == "hi"


def test_the_text_generated_before_a_client_left_a_completions_stream_is_its_choices_text() -> None:
    """What the gateway counts itself when no usage came (the client left): a completions stream's `text` of
    every choice (two interleaved, as for `n: 2`), not a chat delta's `content`."""
    finished: list[StreamRelay] = []
    chunks = [b'data: {"choices":[{"index":0,"text":"ab"}]}\n\n', b'data: {"choices":[{"index":1,"text":"cd"}]}\n\n',
              b'data: {"choices":[{"index":0,"text":null,"finish_reason":"length"}]}\n\n']
    relay = _relay(chunks, then_hang=True, finished=finished)
    relay.fmt = COMPLETIONS_STREAM
    _leave_mid_stream(relay)
    assert finished == [relay] and relay.disconnected and relay.usage is None
    assert relay.generated_text() == "abcd"


def test_a_client_leaving_while_the_rest_is_already_buffered_is_a_disconnect() -> None:
    """As uvicorn does: once the connection is lost, `send` drops what it is given without a word. The engine's
    next 2,000 chunks are already buffered (reading them never suspends): the relay must still notice the client
    leaving (within `SSEResponse.YIELD_EVERY` chunks), not relay the rest into nothing and call it complete."""
    finished: list[StreamRelay] = []
    relay = _relay([_CHUNK] * 2000 + [_USAGE, _DONE], then_hang=False, finished=finished)
    lost = asyncio.Event()
    delivered: list[bytes] = []

    async def run() -> None:
        async def send(message: MutableMapping[str, Any]) -> None:
            if lost.is_set():
                return
            delivered.append(message.get("body", b""))
            if len(delivered) == 6:  # the response start and five chunks read, then the client leaves
                lost.set()

        async def receive() -> dict[str, Any]:
            await lost.wait()
            return {"type": "http.disconnect"}

        await asyncio.wait_for(SSEResponse(relay.body(), {})({}, receive, send), timeout=5)

    asyncio.run(run())
    assert finished == [relay]
    assert (relay.completed, relay.disconnected) == (False, True)
    assert b"".join(delivered) == _CHUNK * 5
    assert relay.generated_text().count("hi") <= 5 + 2 * SSEResponse.YIELD_EVERY
