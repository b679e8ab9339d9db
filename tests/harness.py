"""The gateway in-process, without a port: built by its public composition root (`build_runtime`, `create_app`) over
fake engines that are ASGI apps (`loadtest.fake_upstream.FakeUpstream`) reached through httpx's `ASGITransport`.

A request through it takes milliseconds and no socket. What it cannot show, and what stays with a real uvicorn server
(`tests.servers.serve`) or a real engine: bytes arriving over time (both transports hand over a whole answer at
once, so time to first token, a client leaving mid-stream and an engine stalling mid-stream are end-to-end claims),
TLS, several processes and anything about ports and sockets.

- `FakeEngines`: ASGI apps by host name (`http://<name>.engine.test`); `client()` is the gateway's engine client
  with those hosts reaching their apps (`backends.clients.protocol`'s contract: a fake host it does not know refuses
  the connection, an error status is an `EngineHTTPError`, a stream arrives as its first event and then the rest),
  and any other host reached over the network as usual.
- `in_process(settings, engines)`: the app with its lifespan run and its runtime, for async tests.
- `InProcessGateway`: the same on an event loop of its own (a daemon thread), with a synchronous `httpx.Client`,
  for synchronous tests (the shape of the served gateway's fixtures: poll with `tests.servers.until`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Coroutine
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, Self, TypeVar, cast

import httpx
import httpx2
import openai

from backends.clients.protocol import EngineClient, EngineHTTPError, EngineUnavailable, Headers, with_json
from backends.clients.shared import EngineClients
from gateway.api.app import GatewayApp, create_app
from gateway.api.runtime import Runtime, build_runtime
from gateway.ledger.store import CostRecord, MemoryLedger
from gateway.settings import Settings
from tests.servers import serve, until

__all__ = ["BASE_URL", "FAKE_DOMAIN", "FakeEngines", "Gateway", "InProcess", "InProcessGateway", "ServedGateway",
           "in_process", "lifespan", "wait_records"]

FAKE_DOMAIN = ".engine.test"
BASE_URL = "http://gateway.test"
"""The in-process gateway's base URL (the host is not resolved: every request goes to the app)."""

T = TypeVar("T")


class _ByHost(httpx.AsyncBaseTransport):
    """Each request to the app of its URL's host; a host without one refuses the connection."""

    def __init__(self, apps: dict[str, httpx.ASGITransport]) -> None:
        self._apps = apps

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        transport = self._apps.get(request.url.host)
        if transport is None:
            raise httpx.ConnectError(f"connection refused: no fake engine at {request.url.host}", request=request)
        return await transport.handle_async_request(request)


def _chunks(body: bytes) -> list[bytes]:
    """A server-sent-event body as a zero-latency engine's answer reaches the gateway over loopback: its first event
    on its own, the rest in one burst (so both a stream's first chunk alone and chunks of many events are seen)."""
    first, sep, rest = body.partition(b"\n\n")
    return [chunk for chunk in (first + sep, rest) if chunk]


class _AsgiEngineClient:
    """An `EngineClient` over `FakeEngines`' apps."""

    def __init__(self, apps: dict[str, httpx.ASGITransport]) -> None:
        self._client = httpx.AsyncClient(transport=_ByHost(apps), timeout=60)

    async def _send(self, method: str, url: str, body: bytes | None, headers: Headers | None) -> httpx.Response:
        try:
            return await self._client.request(method, url, content=body, headers=dict(headers or {}))
        except httpx.ConnectError as exc:
            raise EngineUnavailable(f"{url}: {exc}") from exc

    async def post_json(self, base_url: str, path: str, body: bytes, headers: Headers | None = None) -> bytes:
        response = await self._send("POST", base_url + path, body, with_json(headers))
        if response.status_code >= 400:
            raise EngineHTTPError(response.status_code, response.content)
        return response.content

    @asynccontextmanager
    async def _stream(self, base_url: str, path: str, body: bytes,
                      headers: Headers | None) -> AsyncIterator[AsyncIterator[bytes]]:
        response = await self._send("POST", base_url + path, body, with_json(headers))
        if response.status_code >= 400:
            raise EngineHTTPError(response.status_code, response.content)

        async def chunks() -> AsyncIterator[bytes]:
            for chunk in _chunks(response.content):
                yield chunk

        yield chunks()

    def stream(self, base_url: str, path: str, body: bytes,
               headers: Headers | None = None) -> AbstractAsyncContextManager[AsyncIterator[bytes]]:
        return self._stream(base_url, path, body, headers)

    async def get_text(self, url: str, timeout_s: float = 2.0, headers: Headers | None = None) -> str:
        response = await self._send("GET", url, None, headers)
        if response.status_code >= 400:
            raise EngineUnavailable(f"{url}: HTTP {response.status_code}")
        return response.text

    async def aclose(self) -> None:
        await self._client.aclose()


class _FakeEngineClients(EngineClients):
    """The gateway's engine client (`backends.clients.shared.EngineClients`, connection settings and all) with the
    fake engines' hosts (`*.engine.test`) going to their apps instead of over the network."""

    def __init__(self, apps: dict[str, httpx.ASGITransport]) -> None:
        super().__init__()
        self._fakes = _AsgiEngineClient(apps)

    def client_for(self, url: str) -> EngineClient:
        if (httpx.URL(url).host or "").endswith(FAKE_DOMAIN):
            return self._fakes
        return super().client_for(url)

    async def aclose(self) -> None:
        await self._fakes.aclose()
        await super().aclose()


class FakeEngines:
    """Fake engines (ASGI apps) by name, served to in-process gateways at `http://<name>.engine.test`."""

    def __init__(self) -> None:
        self._apps: dict[str, httpx.ASGITransport] = {}

    def add(self, name: str, app: Any) -> str:
        """Serve `app` (an ASGI app: a `FakeUpstream`) as the engine `name`; returns its base URL."""
        host = name + FAKE_DOMAIN
        self._apps[host] = httpx.ASGITransport(app)
        return f"http://{host}"

    def client(self) -> EngineClients:
        """A new engine client that reaches these engines (those added later too) and any other over the network;
        its owner closes it."""
        return _FakeEngineClients(self._apps)


async def _lifespan_messages(app: Any, inbox: asyncio.Queue[dict[str, str]],
                             outbox: asyncio.Queue[dict[str, Any]]) -> None:
    scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
    await app(scope, inbox.get, outbox.put)


async def _reply(task: asyncio.Task[None], outbox: asyncio.Queue[dict[str, Any]], expected: str) -> None:
    """Wait for the app's lifespan reply; raise if it failed or its task ended without one."""
    reply = asyncio.ensure_future(outbox.get())
    await asyncio.wait([reply, task], return_when=asyncio.FIRST_COMPLETED)
    if not reply.done():
        reply.cancel()
        task.result()  # the lifespan's own exception
        raise RuntimeError(f"the app's lifespan ended without {expected}")
    message = reply.result()
    if message["type"] != expected:
        raise RuntimeError(f"lifespan: {message.get('message') or message['type']}")


@asynccontextmanager
async def lifespan(app: Any) -> AsyncIterator[None]:
    """Run `app`'s ASGI lifespan: its startup before the block, its shutdown after (what a server does)."""
    inbox: asyncio.Queue[dict[str, str]] = asyncio.Queue()
    outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    task = asyncio.create_task(_lifespan_messages(app, inbox, outbox), name="lifespan")
    await inbox.put({"type": "lifespan.startup"})
    await _reply(task, outbox, "lifespan.startup.complete")
    try:
        yield
    finally:
        await inbox.put({"type": "lifespan.shutdown"})
        await _reply(task, outbox, "lifespan.shutdown.complete")
        await task


@dataclass(frozen=True)
class InProcess:
    """A gateway app running in this event loop, its runtime, and an async client of it (base URL `BASE_URL`)."""

    app: GatewayApp
    runtime: Runtime
    client: httpx.AsyncClient


@asynccontextmanager
async def in_process(settings: Settings, engines: FakeEngines | None = None) -> AsyncIterator[InProcess]:
    """The gateway `settings` describe, built as `cascade serve` builds it and with its lifespan run, over `engines`
    (None: none; either way, engines on ports are reached through the real engine client); closed after the block."""
    runtime = await build_runtime(settings, engine_client=(engines or FakeEngines()).client())
    try:
        app = create_app(settings, runtime)
        async with lifespan(app), httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url=BASE_URL,
                                                    timeout=60) as client:
            yield InProcess(app, runtime, client)
    finally:
        await runtime.aclose()


class _OnLoop(httpx.BaseTransport):
    """A synchronous transport that hands each request to an ASGI app running on another thread's event loop and
    waits for the whole answer."""

    def __init__(self, app: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._asgi = httpx.ASGITransport(app)
        self._loop = loop

    async def _send(self, request: httpx.Request) -> tuple[int, httpx.Headers, bytes]:
        response = await self._asgi.handle_async_request(request)
        stream = cast(httpx.AsyncByteStream, response.stream)
        return response.status_code, response.headers, b"".join([chunk async for chunk in stream])

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        forwarded = httpx.Request(request.method, request.url, headers=request.headers, content=request.read())
        timeout = request.extensions.get("timeout", {}).get("read") or 60.0
        future = asyncio.run_coroutine_threadsafe(self._send(forwarded), self._loop)
        try:
            status, headers, body = future.result(timeout)
        except TimeoutError as exc:
            future.cancel()
            raise httpx.ReadTimeout(f"no answer in {timeout:g} s", request=request) from exc
        return httpx.Response(status, headers=headers, content=body, request=request)


class _ThroughClient(httpx2.BaseTransport):
    """The OpenAI SDK's HTTP client (httpx2) sending through a test's httpx client (and so to an in-process app)."""

    def __init__(self, client: httpx.Client) -> None:
        self._client = client

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        response = self._client.request(request.method, str(request.url), headers=request.headers.raw,
                                        content=request.read())
        headers = [(k, v) for k, v in response.headers.raw if k.lower() != b"content-encoding"]  # content: decoded
        return httpx2.Response(response.status_code, headers=headers, content=response.content)


def wait_records(ledger: MemoryLedger, n: int, timeout_s: float = 5.0) -> dict[str, CostRecord]:
    """`ledger`'s records once there are `n` (and not more), by request id (the accountant writes after the
    answer)."""
    records = ledger.records
    until(lambda: len(records) >= n, timeout_s, lambda: f"{len(records)} ledger records, not {n}")
    assert len(records) == n, f"{len(records)} ledger records, not {n}"
    return dict(records)


class Gateway:
    """What a test sees of a gateway under test, in-process or served: `client` (synchronous, base URL `url`), the
    app, its runtime. A context manager; `close` stops it."""

    url: str
    client: httpx.Client
    app: GatewayApp

    @property
    def runtime(self) -> Runtime:
        runtime: Runtime = self.app.state.runtime
        return runtime

    @property
    def ledger(self) -> MemoryLedger:
        """The runtime's ledger, which a gateway with `ledger="memory"` keeps in this process."""
        ledger = self.runtime.ledger
        assert isinstance(ledger, MemoryLedger), "a gateway with ledger='memory' has a MemoryLedger"
        return ledger

    def record(self, request_id: str, timeout_s: float = 5.0) -> CostRecord:
        """The memory ledger's record of `request_id`, once written (the accountant writes after the answer)."""
        records = self.ledger.records
        until(lambda: request_id in records, timeout_s, lambda: f"no ledger record for {request_id}")
        return records[request_id]

    def records(self, n: int, timeout_s: float = 5.0) -> dict[str, CostRecord]:
        """The memory ledger's records once there are `n` (and not more), by request id."""
        return wait_records(self.ledger, n, timeout_s)

    def openai(self, api_key: str = "unused", **options: Any) -> openai.OpenAI:
        """An OpenAI SDK client of the gateway, its requests sent through `client`."""
        http_client = httpx2.Client(transport=_ThroughClient(self.client))
        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, http_client=http_client, **options)

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class InProcessGateway(Gateway):
    """`in_process` on an event loop of its own (a daemon thread), for synchronous tests; `run` runs a coroutine on
    that loop."""

    url = BASE_URL

    def __init__(self, settings: Settings, engines: FakeEngines | None = None) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="in-process-gateway", daemon=True)
        self._thread.start()
        self._served = in_process(settings, engines)
        try:
            self.app = self.run(self._served.__aenter__()).app
        except BaseException:
            self._stop_loop()
            raise
        self.client = httpx.Client(transport=_OnLoop(self.app, self._loop), base_url=BASE_URL, timeout=60)

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = 60.0) -> T:
        """Run `coro` on the gateway's event loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def close(self) -> None:
        self.client.close()
        try:
            self.run(self._served.__aexit__(None, None, None))
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


class ServedGateway(Gateway):
    """`create_app(settings)` on a real uvicorn server on a free loopback port (`tests.servers.serve`), for the claims
    an in-process gateway cannot show (see the module's docstring)."""

    def __init__(self, settings: Settings, **options: Any) -> None:
        self.app = create_app(settings)
        self._served = serve(self.app, **options)
        self.url = self._served.__enter__()
        self.client = httpx.Client(base_url=self.url, timeout=60)

    def close(self) -> None:
        self.client.close()
        self._served.__exit__(None, None, None)
