"""Relay an engine's SSE stream to the client, chunk by chunk, while watching it for accounting.

The relay never parses ordinary chunks: it splits events on blank lines, notes the first content
event (TTFT) and the gaps between content events per network chunk (`_content_arrived`), picks out the
usage event (the engine always gets `include_usage`, the client sees the usage event only if it asked),
and keeps the events so that, if the client leaves early, the text generated so far can be counted.
Leaving early closes the upstream connection, so vLLM aborts the request and frees its KV cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.types import Receive, Scope, Send

from backends.clients.shared import EngineError
from gateway.errors import error_body
from gateway.serving.openai.usage import Usage, usage_from_json
from gateway.serving.records.tracing import first_token

__all__ = ["CHAT_STREAM", "COMPLETIONS_STREAM", "RESPONSES_STREAM", "SSEResponse", "StreamFormat", "StreamRelay",
           "sse_json"]

_USAGE = b'"usage":{'
_DONE = b"data: [DONE]"
_RESPONSES_TEXT = ("response.output_text.delta", "response.function_call_arguments.delta",
                   "response.reasoning_text.delta")


def _chat_texts(chunk: dict[str, Any]) -> list[str]:
    return [c for choice in chunk.get("choices") or () if isinstance(c := (choice.get("delta") or {}).get("content"),
                                                                      str)]


def _completion_texts(chunk: dict[str, Any]) -> list[str]:
    return [t for choice in chunk.get("choices") or () if isinstance(t := choice.get("text"), str)]


def _responses_texts(chunk: dict[str, Any]) -> list[str]:
    delta = chunk.get("delta")
    return [delta] if chunk.get("type") in _RESPONSES_TEXT and isinstance(delta, str) else []


@dataclass(frozen=True, slots=True)
class StreamFormat:
    """How one endpoint's stream reads: `content` marks an event with generated text (TTFT, gaps) unless it holds
    `empty`; an event starting with one of `final` ends the answer; `texts(chunk)` is a chunk's generated text."""

    content: bytes
    empty: bytes
    final: tuple[bytes, ...]
    texts: Callable[[dict[str, Any]], list[str]]


CHAT_STREAM = StreamFormat(b'"content":"', b'"content":""', (_DONE,), _chat_texts)
COMPLETIONS_STREAM = StreamFormat(b'"text":"', b'"text":""', (_DONE,), _completion_texts)
# a Responses stream has no [DONE]: its last event is the response's terminal state (usage in it)
RESPONSES_STREAM = StreamFormat(b'"delta":"', b'"delta":""', tuple(
    b"event: response." + state for state in (b"completed", b"incomplete", b"failed")), _responses_texts)


class StreamRelay:
    """One relayed stream. Its `body()` generator is the client's response body.

    What happens when the body ends, for any reason (complete, client gone, engine failed), is an ordered list,
    `at_end`: `on_finish(relay)` first, then each callback added (`add_finish_callback`), each called exactly once,
    in that order; none may block (schedule async work). On the request path: the output checks' verdict, the call's
    record (`Forwarder.relay`), then the response cache's keep and the learning tap. After the body ends,
    `completed`, `disconnected`, `error`, `usage`, `ttft_s` and `generated_text()` describe what happened.
    """

    def __init__(
        self,
        first_chunk: bytes,
        chunks: AsyncIterator[bytes],
        upstream: AsyncExitStack,
        forward_usage: bool,
        started: float,
        on_finish: Callable[[StreamRelay], None],
    ) -> None:
        self.fmt = CHAT_STREAM  # the endpoint's stream format (chat, completions, Responses): set before `body()`
        self._first = first_chunk
        self._chunks = chunks
        self._upstream = upstream
        self._forward_usage = forward_usage
        self._started = started
        self.at_end: list[Callable[[StreamRelay], None]] = [on_finish]
        self._buffer = b""
        self._events: list[bytes] = []
        self.usage: Usage | None = None
        self.ttft_s: float | None = None
        self.gaps_s: list[float] = []  # inter-token gaps: one per content event after the first chunk's
        self._last_content: float | None = None
        self.completed = False
        self._done_relayed = False  # the client has been handed `data: [DONE]`
        self.disconnected = False
        self.error: str | None = None
        self.output_check = ""  # the output checks' verdict on the whole answer, set when it ends (`Forwarder.relay`)

    def add_finish_callback(self, callback: Callable[[StreamRelay], None]) -> None:
        """Also call `callback(relay)` when the body ends, after those in `at_end`; the same rules apply (once,
        must not block, must not raise)."""
        self.at_end.append(callback)

    def _feed(self, chunk: bytes) -> bytes:
        parts = (self._buffer + chunk).split(b"\n\n")
        self._buffer = parts.pop()
        out = []
        content = 0
        for event in parts:
            has_content = self.fmt.content in event and self.fmt.empty not in event
            content += has_content
            if _USAGE in event:
                # the last usage seen counts: an engine that reports usage on every chunk (vLLM's
                # continuous_usage_stats) sends running totals, and the first of them counts 0 completion tokens
                self.usage = _parse_usage(event) or self.usage
                if not self._forward_usage and not has_content:
                    continue
            if event.startswith(self.fmt.final):
                self._done_relayed = True
            self._events.append(event)
            out.append(event)
        if content:
            self._content_arrived(time.monotonic(), content)
        return b"\n\n".join(out) + b"\n\n" if out else b""

    def _content_arrived(self, now: float, events: int) -> None:
        """`events` content events completed in one network chunk that arrived at `now`.

        Timed per chunk, not per event: events parsed from one chunk arrived together, and timing each as it is
        parsed gave gaps of about 0 for all but the first. A chunk of k events after a gap g counts g/k, k times
        (as SGLang's serving benchmark does), rather than g once and 0 for the others: the engine made those k
        tokens over g, a reader sees text come at k tokens per g, and the histogram then has one observation
        per token summing to the decode time, so `histogram_quantile` gives the per-token pace. With g once and
        0s, an engine that sends two tokens a chunk would show a p50 of 0 and a p99 of the chunk gap, neither a
        token's latency. The events that come with the first one share its TTFT: they add no gap.
        """
        if self._last_content is None:
            self.ttft_s = now - self._started
            first_token()
        else:
            gap = (now - self._last_content) / events
            if events == 1:  # the common case: no list to build
                self.gaps_s.append(gap)
            else:
                self.gaps_s.extend([gap] * events)
        self._last_content = now

    async def body(self) -> AsyncIterator[bytes]:
        try:
            out = self._feed(self._first)
            if out:
                yield out
            # Stop at `[DONE]`: the answer is whole, and waiting for the engine to close the connection
            # would race a client that (rightly) leaves as soon as it has read `[DONE]`.
            while not self._done_relayed:
                chunk = await anext(self._chunks, None)
                if chunk is None:
                    break
                out = self._feed(chunk)
                if out:
                    yield out
            if self._buffer.strip() and not self._done_relayed:
                yield self._buffer
            self.completed = True
        except EngineError as exc:
            self.error = f"engine stream failed: {type(exc).__name__}"
            yield b"data: " + error_body(self.error, "upstream_error", None, "engine_stream_failed") + b"\n\n"
        except (asyncio.CancelledError, GeneratorExit):
            # A client that leaves right after `[DONE]` got the whole answer: that is a completed request.
            self.completed = self._done_relayed
            self.disconnected = not self._done_relayed
            raise
        finally:
            await self._upstream.aclose()
            for each in self.at_end:
                each(self)

    @property
    def events(self) -> tuple[bytes, ...]:
        """The SSE events relayed to the client so far."""
        return tuple(self._events)

    def generated_text(self) -> str:
        """The content generated so far, from the relayed events (parsed only when needed)."""
        return "".join(text for event in self._events for chunk in sse_json(event) for text in self.fmt.texts(chunk))


def sse_json(event: bytes) -> Iterator[dict[str, Any]]:
    """The JSON objects carried by the `data:` lines of one SSE event (malformed ones are skipped)."""
    for line in event.split(b"\n"):
        line = line.strip()
        if line.startswith(b"data: {"):
            with contextlib.suppress(orjson.JSONDecodeError):
                yield orjson.loads(line[6:])


def _parse_usage(event: bytes) -> Usage | None:
    return next((usage_from_json(chunk) for chunk in sse_json(event)), None)


class SSEResponse:
    """ASGI response for an event stream that notices a client leaving on any ASGI server.

    It races the body against `http.disconnect`; when the client leaves first, the body generator is
    cancelled and closed at once (not when the next chunk would have been sent).

    A server may drop what is sent after the client left without a word (uvicorn does), and chunks the engine
    has already sent are relayed without the loop running in between, so the watcher would hear of the client
    leaving only after the whole answer had gone nowhere (recorded as complete). So every `YIELD_EVERY` chunks
    the sender lets the loop run once and stops if the client has gone: a client that leaves is noticed within
    that many chunks, at the cost of one loop pass per that many chunks.
    """

    YIELD_EVERY = 8

    def __init__(self, body: AsyncIterator[bytes], headers: dict[str, str]) -> None:
        self._body = body
        self._headers = [(k.encode(), v.encode()) for k, v in headers.items()]
        self._headers.append((b"content-type", b"text/event-stream; charset=utf-8"))
        self._headers.append((b"cache-control", b"no-cache"))

    async def _send_all(self, send: Send, gone: asyncio.Future[None]) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self._headers})
        sent = 0
        async for chunk in self._body:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            sent += 1
            if sent % self.YIELD_EVERY == 0:
                await asyncio.sleep(0)
                if gone.done():
                    return
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    @staticmethod
    async def _wait_disconnect(receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watcher = asyncio.ensure_future(self._wait_disconnect(receive))
        sender = asyncio.ensure_future(self._send_all(send, watcher))
        try:
            await asyncio.wait((sender, watcher), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (sender, watcher):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await sender
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            aclose = getattr(self._body, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
