"""A zero-latency fake of a vLLM OpenAI-compatible server, for tests and for measuring gateway overhead.

Raw ASGI (no framework) so that it costs as little as possible. It serves `/health`, `/metrics` (vLLM
gauge names), `/tokenize` (1 token per whitespace-separated word, plus 3 per message), and
`/v1/chat/completions` streaming and not, with `usage` (and `stream_options.include_usage`), and
`/v1/responses` and `/v1/completions` (`loadtest.fake_endpoints`), and `/v1/embeddings` (`loadtest.fake_embeddings`).
Knobs (per request, in the body's `metadata`): `fake_tokens` (completion length, default 16),
`fake_delay_ms` (a streamed token every that many ms, on the answer's own clock), `fake_tool_call` (a function
name: with `tools` in the request, each choice is a call of it, `{"q": "w0 w1 ..."}`, streamed as argument deltas);
per server:
`delay_ms`, `max_running`, `fail_status` (every chat request answered with that error status: a broken engine).
`n` choices are answered (streams interleave them, as vLLM does) and `usage` covers them all; `logprobs` /
`top_logprobs` are honoured.
Run: `python -m loadtest.fake_upstream --port 9001`.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import orjson
from starlette.types import Receive, Scope, Send

from loadtest.fake_embeddings import embeddings_json
from loadtest.fake_endpoints import paced, serve_other

__all__ = ["FakeUpstream", "main", "read_body"]

_JSON = [(b"content-type", b"application/json")]
_SSE = [(b"content-type", b"text/event-stream")]


async def read_body(receive: Receive) -> bytes:
    """The whole body of an ASGI HTTP request (no size limit: for test servers and benchmarks only)."""
    body = b""
    while True:
        message = await receive()
        body += bytes(message.get("body", b""))
        if not message.get("more_body"):
            return body


def _prompt_tokens(messages: Any) -> int:
    if not isinstance(messages, list):
        return 0
    return sum(3 + len(str(m.get("content") or "").split()) for m in messages if isinstance(m, dict))


class FakeUpstream:
    """The ASGI app. `requests` counts chat requests; `aborted` counts streams the client left, and
        slow answers (`delay_ms`) it closed before they came."""

    def __init__(self, model: str = "fake", delay_ms: float = 0.0, max_running: int | None = None) -> None:
        """`delay_ms`: default `fake_delay_ms` (a slow engine; may be changed while serving). `max_running`:
        requests served at once; more wait in a queue that /metrics reports as `num_requests_waiting`, as
        a saturated engine's would (None: no limit, and `waiting` is whatever a test sets)."""
        self.model = model
        self.delay_ms = delay_ms
        self.max_running = max_running
        self._slots: asyncio.Semaphore | None = None
        self._slots_loop: asyncio.AbstractEventLoop | None = None  # a restarted server runs on a new loop
        self.requests = 0
        self.aborted = 0
        self.running = 0
        self.kv_cache_usage = 0.0  # what /metrics reports; tests raise it to drive the degradation ladder
        self.waiting = 0.0
        self.last_authorization: str | None = None  # the Authorization header of the last chat request
        self.last_traceparent: str | None = None  # its W3C traceparent header (a traced gateway sends one)
        self.last_body: dict[str, Any] | None = None  # the last chat request's body, as the engine received it
        self.tokenize_requests = 0  # calls of /tokenize (vLLM's token counter)
        self.embedding_requests = 0  # calls of /v1/embeddings (last_body: the last one's body)
        self.content: str | None = None  # a test's choice of every text answer (4 characters a token, stops)
        self.fail_status: int | None = None  # a test's choice: every chat request answered with this error status

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        path = scope["path"]
        if path == "/health":
            return await self._reply(send, 200, b"")
        if path == "/metrics":
            return await self._reply(send, 200, self._metrics(), [(b"content-type", b"text/plain")])
        body = await self._body(receive)
        if path == "/tokenize":
            self.tokenize_requests += 1
            return await self._tokenize(send, body)
        if path == "/v1/chat/completions":
            headers = dict(scope["headers"])
            auth, parent = headers.get(b"authorization"), headers.get(b"traceparent")
            self.last_authorization = auth.decode() if auth else None
            self.last_traceparent = parent.decode() if parent else None
            return await self._chat(send, receive, body)
        if path in ("/v1/responses", "/v1/completions"):
            return await self._other(path, send, receive, body)
        if path == "/v1/embeddings":
            self.embedding_requests += 1
            self.last_body = orjson.loads(body)
            return await self._reply(send, *embeddings_json(self.last_body, self.model))
        await self._reply(send, 404, b'{"error":{"message":"not found","type":"not_found"}}')

    def _metrics(self) -> bytes:
        labels = f'{{engine="0",model_name="{self.model}"}}'
        return (
            f"vllm:num_requests_running{labels} {self.running}.0\n"
            f"vllm:num_requests_waiting{labels} {self.waiting}\n"
            f"vllm:kv_cache_usage_perc{labels} {self.kv_cache_usage}\n"
        ).encode()

    @staticmethod
    async def _body(receive: Receive) -> bytes:
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                return b"".join(chunks)

    @staticmethod
    async def _reply(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] = _JSON) -> None:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _tokenize(self, send: Send, body: bytes) -> None:
        req = orjson.loads(body)
        count = _prompt_tokens(req["messages"]) if "messages" in req else len(str(req.get("prompt", "")).split())
        await self._reply(send, 200, orjson.dumps({"count": count, "tokens": list(range(count))}))

    async def _chat(self, send: Send, receive: Receive, body: bytes) -> None:
        self.requests += 1
        self.last_body = orjson.loads(body)
        if self.fail_status is not None:  # answered as vLLM answers an engine error: the OpenAI envelope
            error = {"message": "the fake engine fails", "type": "InternalServerError", "code": self.fail_status}
            return await self._reply(send, self.fail_status, orjson.dumps({"error": error}))
        if not self.max_running:
            return await self._answer(send, receive, body)
        if self._slots is None or self._slots_loop is not asyncio.get_running_loop():
            self._slots, self._slots_loop = asyncio.Semaphore(self.max_running), asyncio.get_running_loop()
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        try:
            await self._answer(send, receive, body)
        finally:
            self._slots.release()

    async def _other(self, path: str, send: Send, receive: Receive, body: bytes) -> None:
        """`/v1/responses` and `/v1/completions` (`loadtest.fake_endpoints`)."""
        self.requests += 1
        req = orjson.loads(body)
        gone = asyncio.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        watcher = asyncio.create_task(watch()) if req.get("stream") else None
        delay = float((req.get("metadata") or {}).get("fake_delay_ms", self.delay_ms)) / 1000
        self.running += 1
        try:
            if not await serve_other(path, req, send, gone, delay):
                self.aborted += 1
        except (OSError, asyncio.CancelledError):
            self.aborted += 1
            raise
        finally:
            self.running -= 1
            if watcher is not None:
                watcher.cancel()

    async def _answer(self, send: Send, receive: Receive, body: bytes) -> None:
        req = orjson.loads(body)
        meta = req.get("metadata") or {}
        n = int(meta.get("fake_tokens", 16))
        limit = req.get("max_completion_tokens") or req.get("max_tokens")
        n = min(n, int(limit)) if limit else n
        answer = _Answer(req, n, self.content)
        delay = float(meta.get("fake_delay_ms", self.delay_ms)) / 1000
        if not req.get("stream"):
            if delay:
                try:
                    await asyncio.sleep(delay * n)
                except asyncio.CancelledError:  # the client closed the request (in-process: its task cancelled)
                    self.aborted += 1
                    raise
            out = {"id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()),
                   "model": req.get("model"), "choices": [answer.choice(i) for i in range(answer.choices)],
                   "usage": answer.usage}
            return await self._reply(send, 200, orjson.dumps(out))
        gone = asyncio.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        watcher = asyncio.create_task(watch())
        try:
            await self._stream(send, gone, req, answer, delay)
        finally:
            watcher.cancel()

    async def _stream(self, send: Send, gone: asyncio.Event, req: dict[str, Any], answer: _Answer,
                      delay: float) -> None:
        head = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": int(time.time()),
                "model": req.get("model")}

        async def event(obj: dict[str, Any], more: bool = True) -> None:
            await send({"type": "http.response.body", "body": b"data: " + orjson.dumps(obj) + b"\n\n",
                        "more_body": more})

        await send({"type": "http.response.start", "status": 200, "headers": _SSE})
        self.running += 1
        try:
            for c in range(answer.choices):
                await event({**head, "choices": [{"index": c, "delta": answer.first_delta(c)}]})
            async for i in paced(answer.steps, delay):
                if gone.is_set():  # the client left: stop generating, as vLLM aborts the request
                    self.aborted += 1
                    return
                for c in range(answer.choices):
                    await event({**head, "choices": [answer.delta(c, i)]})
            tail = b""
            if (req.get("stream_options") or {}).get("include_usage"):
                tail = b"data: " + orjson.dumps({**head, "choices": [], "usage": answer.usage}) + b"\n\n"
            await send({"type": "http.response.body", "body": tail + b"data: [DONE]\n\n"})
        except (OSError, asyncio.CancelledError):
            self.aborted += 1
            raise
        finally:
            self.running -= 1


class _Answer:
    """The fake's answer to one request: `choices` choices of `tokens` tokens each, text or a tool call."""

    def __init__(self, req: dict[str, Any], tokens: int, content: str | None = None) -> None:
        meta = req.get("metadata") or {}
        self.choices = int(req.get("n") or 1)
        self.tool = meta.get("fake_tool_call") if req.get("tools") else None
        self.content = None if self.tool or content is None else [content[i:i + 4] for i in range(0, len(content), 4)]
        self.tokens = tokens if self.content is None else max(1, len(self.content))
        self.logprob = float(meta.get("fake_logprob", -0.1))
        self.logprobs = bool(req.get("logprobs"))
        self.top = int(req.get("top_logprobs") or 0)
        prompt = _prompt_tokens(req.get("messages"))
        completion = tokens * self.choices
        self.usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    @property
    def steps(self) -> int:
        return self.tokens + 2 if self.tool else self.tokens  # a tool call's arguments open and close

    def _pieces(self) -> list[str]:
        if self.tool:
            return ['{"q": "', *(f"w{i} " for i in range(self.tokens)), '"}']
        if self.content is not None:
            return self.content or [""]
        return [f" w{i}" for i in range(self.tokens)]

    def _logprobs(self, tokens: list[str]) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        top = [{"token": f"alt{k}", "logprob": self.logprob - k - 1, "bytes": None} for k in range(self.top)]
        return {"content": [{"token": t, "logprob": self.logprob, "bytes": None, "top_logprobs": top}
                            for t in tokens]}

    def _call(self, choice: int, arguments: str) -> dict[str, Any]:
        return {"index": 0, "id": f"call_fake_{choice}", "type": "function",
                "function": {"name": self.tool, "arguments": arguments}}

    def choice(self, index: int) -> dict[str, Any]:
        """Choice `index` of a non-streamed answer."""
        pieces = self._pieces()
        if self.tool:
            message: dict[str, Any] = {"role": "assistant", "content": None,
                                       "tool_calls": [{k: v for k, v in self._call(index, "".join(pieces)).items()
                                                       if k != "index"}]}
        else:
            message = {"role": "assistant", "content": "".join(pieces).strip()}
        reason = "tool_calls" if self.tool else ("length" if self.content is None else "stop")
        return {"index": index, "message": message, "logprobs": self._logprobs(pieces), "finish_reason": reason}

    def first_delta(self, choice: int) -> dict[str, Any]:
        return {"role": "assistant", "content": None if self.tool else ""}

    def delta(self, choice: int, step: int) -> dict[str, Any]:
        """Choice `choice`'s chunk at step `step`; the last step carries the finish reason."""
        piece = self._pieces()[step]
        last = step == self.steps - 1
        if self.tool:
            call = self._call(choice, piece) if step == 0 else {"index": 0, "function": {"arguments": piece}}
            delta: dict[str, Any] = {"tool_calls": [call]}
            reason = "tool_calls" if last else None
        else:
            end = "length" if self.content is None else "stop"
            delta, reason = {"content": piece}, (end if last else None)
        out: dict[str, Any] = {"index": choice, "delta": delta, "finish_reason": reason}
        lp = self._logprobs([piece])
        if lp is not None:
            out["logprobs"] = lp
        return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Zero-latency fake OpenAI/vLLM upstream.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9001)
    parser.add_argument("--model", default="fake")
    parser.add_argument("--delay-ms", type=float, default=0.0,
                        help="sleep before each streamed token (whole answer: per token) unless the request says")
    parser.add_argument("--max-running", type=int, default=None, help="requests served at once; more queue")
    parser.add_argument("--content", default=None, help="every text answer is this (4 characters a token)")
    args = parser.parse_args(argv)
    import uvicorn

    app = FakeUpstream(args.model, args.delay_ms, args.max_running)
    app.content = args.content
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning",
                loop="uvloop", http="httptools", access_log=False)


if __name__ == "__main__":
    main()
