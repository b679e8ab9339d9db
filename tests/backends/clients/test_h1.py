"""The `h1` engine client against the fake engine (real uvicorn) and raw sockets that misbehave on purpose."""

from __future__ import annotations

import asyncio
import gc
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager

import orjson
import pytest
import uvloop
from starlette.types import Receive, Scope, Send

from backends.clients import h1
from backends.clients.h1 import H1EngineClient
from backends.clients.shared import (
    EngineHTTPError,
    EngineStreamBroken,
    EngineTimeout,
    EngineUnavailable,
    Timeouts,
    make_engine_client,
)
from loadtest.fake_upstream import FakeUpstream
from tests.servers import free_port, serve

CHAT = "/v1/chat/completions"
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class _Recording:
    """The fake engine, plus the client address of each chat request and a 500 on /boom."""

    def __init__(self, delay_ms: float = 0.0) -> None:
        self.engine = FakeUpstream("m", delay_ms=delay_ms)
        self.peers: list[tuple[str, int]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/boom":
            await send({"type": "http.response.start", "status": 500, "headers": []})
            await send({"type": "http.response.body", "body": b"engine exploded"})
            return
        if scope["type"] == "http" and scope["path"] == CHAT:
            self.peers.append(tuple(scope["client"]))
        await self.engine(scope, receive, send)


@pytest.fixture
def fake() -> Iterator[tuple[_Recording, str]]:
    app = _Recording()
    with serve(app) as url:
        yield app, url


@pytest.fixture
def slow() -> Iterator[tuple[_Recording, str]]:
    app = _Recording(delay_ms=50)
    with serve(app) as url:
        yield app, url


def _chat(tokens: int = 4, stream: bool = False) -> bytes:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": tokens, "stream": stream,
            "stream_options": {"include_usage": True}}
    return orjson.dumps(body)


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.lower().split(b"\r\n")
    length = next((int(line.split(b":")[1]) for line in lines if line.startswith(b"content-length")), 0)
    return head + await reader.readexactly(length)


@asynccontextmanager
async def _raw_server(handler: Handler) -> AsyncIterator[tuple[str, list[int]]]:
    """A TCP server running `handler` per connection; yields its URL and a one-item connection counter."""
    accepted = [0]

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted[0] += 1
        try:
            await handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", accepted
    finally:
        server.close()


_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def test_post_json_returns_the_engines_body(fake: tuple[_Recording, str]) -> None:
    client = H1EngineClient()
    try:
        answer = orjson.loads(await client.post_json(fake[1], CHAT, _chat(tokens=3)))
    finally:
        await client.aclose()
    assert answer["choices"][0]["message"]["content"] == "w0 w1 w2"
    assert answer["usage"]["completion_tokens"] == 3


async def test_a_stream_arrives_whole_with_its_usage_chunk_and_done(fake: tuple[_Recording, str]) -> None:
    client = make_engine_client("h1")
    try:
        async with client.stream(fake[1], CHAT, _chat(tokens=5, stream=True)) as chunks:
            data = b"".join([chunk async for chunk in chunks])
    finally:
        await client.aclose()
    events = [e.removeprefix(b"data: ") for e in data.split(b"\n\n") if e]
    assert events[-1] == b"[DONE]"
    assert orjson.loads(events[-2])["usage"]["completion_tokens"] == 5
    assert b"".join(orjson.loads(e)["choices"][0]["delta"]["content"].encode() for e in events[1:-2]) == \
        b" w0 w1 w2 w3 w4"


async def test_sequential_requests_reuse_one_keep_alive_connection(fake: tuple[_Recording, str]) -> None:
    app, url = fake
    client = H1EngineClient()
    try:
        await client.post_json(url, CHAT, _chat())
        async with client.stream(url, CHAT, _chat(stream=True)) as chunks:
            async for _ in chunks:
                pass
        await client.post_json(url, CHAT, _chat())
    finally:
        await client.aclose()
    assert len(app.peers) == 3 and len(set(app.peers)) == 1


async def test_leaving_a_stream_early_closes_the_connection_and_the_engine_aborts(
    slow: tuple[_Recording, str],
) -> None:
    app, url = slow
    client = H1EngineClient()
    try:
        async with client.stream(url, CHAT, _chat(tokens=200, stream=True)) as chunks:
            await anext(aiter(chunks))
        deadline = time.monotonic() + 5
        while app.engine.aborted == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert app.engine.aborted == 1
        await client.post_json(url, CHAT, _chat())
    finally:
        await client.aclose()
    assert app.peers[0] != app.peers[1]  # the cut-short connection was not reused


async def test_a_refused_connection_is_engine_unavailable() -> None:
    client = H1EngineClient()
    url = f"http://127.0.0.1:{free_port()}"
    try:
        with pytest.raises(EngineUnavailable) as info:
            await client.post_json(url, CHAT, _chat())
        assert not isinstance(info.value, EngineTimeout)
        with pytest.raises(EngineUnavailable):
            async with client.stream(url, CHAT, _chat(stream=True)):
                pass
        with pytest.raises(EngineUnavailable):
            await client.get_text(url + "/health")
    finally:
        await client.aclose()


async def test_error_statuses_carry_the_engines_status_and_body(fake: tuple[_Recording, str]) -> None:
    client = H1EngineClient()
    url = fake[1]
    try:
        with pytest.raises(EngineHTTPError) as info:
            await client.post_json(url, "/nowhere", _chat())
        assert info.value.status == 404 and b"not found" in info.value.body
        with pytest.raises(EngineHTTPError) as info:
            async with client.stream(url, "/boom", _chat(stream=True)):
                pass
        assert info.value.status == 500 and info.value.body == b"engine exploded"
        with pytest.raises(EngineUnavailable, match="HTTP 404"):
            await client.get_text(url + "/nowhere")
        assert "vllm:num_requests_running" in await client.get_text(url + "/metrics")
    finally:
        await client.aclose()


async def test_an_engine_dying_mid_stream_breaks_the_stream() -> None:
    async def dies(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(_HEAD + _chunk(b"data: {}\n\n"))
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.transport.abort()

    client = H1EngineClient()
    async with _raw_server(dies) as (url, _):
        try:
            received = []
            with pytest.raises(EngineStreamBroken):
                async with client.stream(url, CHAT, _chat(stream=True)) as chunks:
                    async for chunk in chunks:
                        received.append(chunk)
            assert received == [b"data: {}\n\n"]
        finally:
            await client.aclose()


async def test_a_gap_longer_than_the_read_timeout_breaks_the_stream_and_silence_is_a_timeout() -> None:
    async def stalls(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await _read_request(reader)
        if b"/silent" not in request:
            for _ in range(4):  # gaps shorter than the timeout are fine
                writer.write(_HEAD if _ == 0 else _chunk(b"x"))
                await asyncio.sleep(0.1)
        await asyncio.sleep(8)

    # a read timeout 30x the gaps: at the start of a fresh clone's suite this process's loop stalled for over a
    # second (with 0.3 s the stream was cut before its first chunk, with 1 s after its second)
    client = H1EngineClient(Timeouts(connect=1, read=3.0))
    async with _raw_server(stalls) as (url, _):
        try:
            started = time.monotonic()
            received = []
            with pytest.raises(EngineStreamBroken, match="no data"):
                async with client.stream(url, CHAT, _chat(stream=True)) as chunks:
                    async for chunk in chunks:
                        received.append(chunk)
            assert received == [b"x"] * 3
            assert 3.25 < time.monotonic() - started < 8  # 0.3 s of data, then a 3 s gap (the server's silence: 8 s)
            with pytest.raises(EngineTimeout):
                await client.post_json(url, "/silent", _chat())
        finally:
            await client.aclose()


async def test_a_keep_alive_connection_the_engine_dropped_is_retried_once_on_a_fresh_one() -> None:
    async def one_answer_per_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        await _read_request(reader)  # a second request on this connection: drop it unanswered

    client = H1EngineClient()
    async with _raw_server(one_answer_per_connection) as (url, accepted):
        try:
            assert await client.post_json(url, CHAT, _chat()) == b"ok"
            assert await client.post_json(url, CHAT, _chat()) == b"ok"
            assert accepted[0] == 2
        finally:
            await client.aclose()


async def test_a_fresh_connection_closed_unanswered_is_not_retried() -> None:
    async def hangs_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)

    client = H1EngineClient()
    async with _raw_server(hangs_up) as (url, accepted):
        try:
            with pytest.raises(EngineUnavailable):
                await client.post_json(url, CHAT, _chat())
            assert accepted[0] == 1
        finally:
            await client.aclose()


async def test_get_text_gives_up_after_its_own_timeout() -> None:
    async def never_answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(5)

    client = H1EngineClient()
    async with _raw_server(never_answers) as (url, _):
        try:
            started = time.monotonic()
            with pytest.raises(EngineTimeout):
                await client.get_text(url + "/health", timeout_s=0.2)
            assert time.monotonic() - started < 3  # long before the server's 5 s (1 s failed once: a stalled loop)
        finally:
            await client.aclose()


async def test_a_lagging_consumer_pauses_reading_without_tripping_the_read_timeout() -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB

    async def floods(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(_HEAD + b"".join(_chunk(payload[i:i + 8192]) for i in range(0, len(payload), 8192)) + b"0\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(2)

    client = H1EngineClient(Timeouts(connect=1, read=0.2))
    async with _raw_server(floods) as (url, _):
        try:
            async with client.stream(url, CHAT, _chat(stream=True)) as chunks:
                await asyncio.sleep(0.5)  # longer than the read timeout, with the buffer full
                data = b"".join([chunk async for chunk in chunks])
        finally:
            await client.aclose()
    assert data == payload


async def test_the_connection_limit_queues_requests(slow: tuple[_Recording, str]) -> None:
    app, url = slow
    client = H1EngineClient(max_connections=1)
    try:
        answers = await asyncio.gather(*(client.post_json(url, CHAT, _chat(tokens=2)) for _ in range(3)))
    finally:
        await client.aclose()
    assert len(answers) == 3 and len(set(app.peers)) == 1


def test_streams_under_uvloop(fake: tuple[_Recording, str]) -> None:
    async def run() -> bytes:
        client = H1EngineClient()
        try:
            async with client.stream(fake[1], CHAT, _chat(tokens=3, stream=True)) as chunks:
                return b"".join([chunk async for chunk in chunks])
        finally:
            await client.aclose()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(run()).endswith(b"data: [DONE]\n\n")


async def test_a_finished_exchange_is_freed_by_reference_counting(fake: tuple[_Recording, str],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing of a finished request is left for the cyclic collector (its pauses are the gateway's tail)."""
    made: list[weakref.ref[h1._Exchange]] = []

    class Watched(h1._Exchange):
        def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
            super().__init__(transport, loop)
            made.append(weakref.ref(self))

    monkeypatch.setattr(h1, "_Exchange", Watched)
    client = H1EngineClient()
    gc.disable()
    try:
        await client.post_json(fake[1], CHAT, _chat())
        async with client.stream(fake[1], CHAT, _chat(stream=True)) as chunks:
            async for _ in chunks:
                pass
        del chunks
        assert len(made) == 2 and [ref() for ref in made] == [None, None]  # while the connection stays pooled
    finally:
        gc.enable()
        await client.aclose()
