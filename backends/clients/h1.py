"""A lean HTTP/1.1 engine client on asyncio Protocols and the C parser `httptools` (transport `h1`), for
plain-http engines on this host only: `backends.clients.shared` sends https and other hosts to aiohttp.

Why: each request and each relayed chunk costs the gateway CPU, and aiohttp's client spends much of it in
its own machinery (session and request objects, stream reader, flow control, a read timer re-armed on every
chunk). Here one `data_received` runs the C parser once and hands the body bytes of every chunk it parsed to
the consumer as one `bytes`; the read timeout is one timer per request that re-arms itself from a "last
data" time. Measured side by side: BENCHMARKS.md, "Engine clients".

Connections: a keep-alive pool per (host, port), `max_connections` in all (a request waits for a slot when
all are busy); an idle one is kept `keepalive_s`, under the engine's own keep-alive. A connection goes back
to the pool only when its response arrived whole and the engine allows keep-alive; any other end closes it,
which is how vLLM learns that a stream was left. A request on a reused connection that the engine had
closed while idle (nothing of the response came back) is retried once on a fresh connection. Errors follow
`backends.clients.protocol`'s contract.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import httptools

from backends.clients.protocol import (
    DEFAULT_TIMEOUTS,
    EngineError,
    EngineHTTPError,
    EngineStreamBroken,
    EngineTimeout,
    EngineUnavailable,
    Headers,
    Timeouts,
)
from backends.clients.transports import KEEPALIVE_S

__all__ = ["H1EngineClient"]

_HIGH_WATER = 64 * 1024  # body bytes buffered for a lagging consumer before the socket stops being read
_FRAMING = (b"content-length", b"transfer-encoding")
_Key = tuple[str, int]  # host, port


@dataclass(frozen=True, slots=True)
class _Origin:
    key: _Key
    host_header: str
    prefix: str  # the path of a base URL such as https://api.example/v1


def _origin(url: str) -> tuple[_Origin, str]:
    """The origin of an absolute http URL, and the rest of it (path and query). No TLS here: https goes
    through aiohttp (`backends.clients.shared`)."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise EngineUnavailable(f"{url}: the h1 client speaks plain http only")
    rest = parts.path + (f"?{parts.query}" if parts.query else "")
    return _Origin((parts.hostname, parts.port or 80), parts.netloc.rpartition("@")[2], parts.path.rstrip("/")), rest


def _head(method: str, target: str, origin: _Origin, body: bytes, headers: Headers | None) -> bytes:
    """The request line and headers. Caller headers override the defaults (Content-Type)."""
    fields = {"host": origin.host_header, "connection": "keep-alive"}
    if method == "POST":
        fields["content-type"] = "application/json"
        fields["content-length"] = str(len(body))
    for name, value in (headers or {}).items():
        if any(c in name or c in value for c in "\r\n\0"):
            raise ValueError(f"header {name!r} contains a line break")
        fields[name.lower()] = value
    lines = "".join(f"{name}: {value}\r\n" for name, value in fields.items())
    return f"{method} {target or '/'} HTTP/1.1\r\n{lines}\r\n".encode()


class _Exchange:
    """One response on a connection: httptools calls in, one consumer takes the body bytes out."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self.parser: httptools.HttpResponseParser | None = httptools.HttpResponseParser(self)  # None once finished
        self.status = 0
        self.received = False  # any byte of the response arrived
        self.complete = False
        self.keep_alive = False
        self.framed = False  # Content-Length or chunked; otherwise the body ends at EOF
        self.error: str | None = None
        self.timed_out = False
        self.paused = False
        self._transport = transport
        self._loop = loop
        self._chunks: list[bytes] = []
        self._size = 0
        self._waiter: asyncio.Future[None] | None = None
        self._headers: asyncio.Future[None] = loop.create_future()

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() in _FRAMING:
            self.framed = True

    def on_headers_complete(self) -> None:
        assert self.parser is not None  # called by the parser, from `feed`
        self.status = self.parser.get_status_code()
        if not self._headers.done():
            self._headers.set_result(None)

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._size += len(body)

    def on_message_complete(self) -> None:
        self.complete = True
        assert self.parser is not None  # called by the parser, from `feed`
        self.keep_alive = self.parser.should_keep_alive()

    def feed(self, data: bytes) -> bool:
        """Parse `data`; False if it is not HTTP (the connection must close)."""
        self.received = True
        if self.parser is None:
            return False
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.fail(f"bad HTTP response: {exc}")
            return False
        if self._chunks or self.complete:
            self._wake()
            if self._size > _HIGH_WATER and not self.paused:
                self.paused = True
                self._transport.pause_reading()
        return True

    def lost(self, exc: Exception | None) -> None:
        if self.status and not self.framed and not self.complete and self.error is None:
            self.complete = True  # a body delimited by the end of the connection
            self._wake()
        else:
            self.fail(f"connection lost ({type(exc).__name__ if exc else 'closed by the engine'})")

    def fail(self, error: str, timed_out: bool = False) -> None:
        """The first failure wins; wakes whoever waits."""
        if self.error is None and not self.complete:
            self.error, self.timed_out = error, timed_out
            if not self._headers.done():
                self._headers.set_result(None)
            self._wake()

    def failure(self, started: bool) -> EngineError:
        """The error to raise: a broken stream once the caller relayed some of it, else unavailable."""
        message = self.error or "connection closed"
        if started:
            return EngineStreamBroken(message)
        return EngineTimeout(message) if self.timed_out else EngineUnavailable(message)

    async def headers(self) -> None:
        await self._headers

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _take(self) -> bytes:
        chunks = self._chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self._chunks, self._size = [], 0
        if self.paused:
            self.paused = False
            self._transport.resume_reading()
        return data

    async def chunks(self, stream: bool) -> AsyncIterator[bytes]:
        """The body as it arrives; each item is everything received since the last one."""
        while True:
            if self._chunks:
                yield self._take()
            elif self.complete:
                return
            elif self.error is not None:
                raise self.failure(stream)
            else:
                await self._wait()

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks(stream=False)])


class _Conn(asyncio.Protocol):
    """One keep-alive connection, one request at a time. The pool owns it."""

    def __init__(self, pool: _Pool, key: _Key) -> None:
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.ex: _Exchange | None = None
        self.closed = False
        self.reused = False
        self.idle_since = 0.0
        self._pool = pool
        self._loop = pool.loop
        self._read_s = pool.timeouts.read
        self._last = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._last = self._loop.time()
        ex = self.ex
        if ex is None or ex.complete or not ex.feed(data):
            self._pool.discard(self)  # unexpected bytes: the connection is unusable

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.ex is not None:
            self.ex.lost(exc)
        self._pool.discard(self)

    def start(self, request: bytes) -> _Exchange:
        assert self.transport is not None
        ex = self.ex = _Exchange(self.transport, self._loop)
        if self.closed:  # lost between connecting and this request
            ex.fail("connection closed before the request was sent")
            return ex
        self._last = self._loop.time()
        self._timer = self._loop.call_at(self._last + self._read_s, self._check)
        self.transport.write(request)
        return ex

    def finish(self) -> _Exchange | None:
        ex, self.ex = self.ex, None
        if ex is not None:
            ex.parser = None  # its callbacks point back at `ex`: so reference counting frees `ex`, not the collector
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if ex is not None and ex.paused and self.transport is not None:
            self.transport.resume_reading()
        return ex

    def _check(self) -> None:
        """The read timeout: fires at most once per `read` seconds, not once per chunk."""
        self._timer = None
        ex = self.ex
        if ex is None or ex.complete or ex.error is not None:
            return
        now = self._loop.time()
        if ex.paused:
            self._last = now  # the consumer lags, not the engine
        elif now - self._last >= self._read_s - 1e-3:
            ex.fail(f"no data from the engine for {self._read_s:g} s", timed_out=True)
            self._pool.discard(self)
            return
        self._timer = self._loop.call_at(self._last + self._read_s, self._check)


class _Pool:
    """Keep-alive connections per origin, `limit` in all (open or connecting)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, timeouts: Timeouts, limit: int, keepalive_s: float) -> None:
        self.loop = loop
        self.timeouts = timeouts
        self._limit = limit
        self._keepalive_s = keepalive_s
        self._idle: dict[_Key, list[_Conn]] = {}
        self._conns: set[_Conn] = set()  # open or connecting: each holds one of the `limit` slots
        self._waiters: deque[asyncio.Future[None]] = deque()
        self.closed = False

    async def acquire(self, origin: _Origin, fresh: bool = False) -> _Conn:
        """An idle connection to `origin` (unless `fresh`) or a new one; waits while all slots are taken."""
        while not self.closed:
            conn = None if fresh else self._pop_idle(origin.key)
            if conn is not None:
                return conn
            if len(self._conns) < self._limit or self._evict_idle():
                return await self._connect(origin)
            await self._wait_slot()
        raise EngineUnavailable("engine client closed")

    def release(self, conn: _Conn) -> None:
        """Back to the pool if its response arrived whole and keep-alive holds; closed otherwise."""
        ex = conn.finish()
        if ex is None or not ex.complete or not ex.keep_alive or conn.closed or self.closed:
            self.discard(conn)
            return
        conn.reused = True
        conn.idle_since = self.loop.time()
        self._idle.setdefault(conn.key, []).append(conn)
        self._wake_one()

    def discard(self, conn: _Conn) -> None:
        """Close `conn` and free its slot (idempotent)."""
        if conn.transport is not None and not conn.closed:
            conn.closed = True
            conn.transport.close()
        if conn in self._conns:
            self._conns.remove(conn)
            idle = self._idle.get(conn.key)
            if idle and conn in idle:
                idle.remove(conn)
            self._wake_one()

    def close(self) -> None:
        self.closed = True
        for conn in list(self._conns):
            self.discard(conn)
        while self._waiters:
            self._wake_one()

    def _pop_idle(self, key: _Key) -> _Conn | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if self.loop.time() - conn.idle_since < self._keepalive_s and not conn.closed:
                return conn
            self.discard(conn)
        return None

    def _evict_idle(self) -> bool:
        """Close the longest-idle connection of any origin to make room; False if none is idle."""
        oldest = min((idle[0] for idle in self._idle.values() if idle), key=lambda c: c.idle_since, default=None)
        if oldest is None:
            return False
        self.discard(oldest)
        return True

    async def _connect(self, origin: _Origin) -> _Conn:
        conn = _Conn(self, origin.key)
        self._conns.add(conn)
        host, port = origin.key
        try:
            async with asyncio.timeout(self.timeouts.connect):
                await self.loop.create_connection(lambda: conn, host, port)
        except TimeoutError as exc:
            self.discard(conn)
            raise EngineTimeout(f"{host}:{port}: no connection in {self.timeouts.connect:g} s") from exc
        except OSError as exc:
            self.discard(conn)
            raise EngineUnavailable(f"{host}:{port}: {type(exc).__name__}: {exc}") from exc
        except BaseException:
            self.discard(conn)
            raise
        return conn

    async def _wait_slot(self) -> None:
        waiter = self.loop.create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._wake_one()  # pass the slot on
            raise

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return


class H1EngineClient:
    """The `h1` transport. The pool is created lazily, inside the running event loop."""

    def __init__(self, timeouts: Timeouts = DEFAULT_TIMEOUTS, max_connections: int = 512,
                 keepalive_s: float = KEEPALIVE_S) -> None:
        self._timeouts = timeouts
        self._limit = max_connections
        self._keepalive_s = keepalive_s
        self._pool: _Pool | None = None
        self._origins: dict[str, _Origin] = {}

    def _p(self) -> _Pool:
        if self._pool is None:
            self._pool = _Pool(asyncio.get_running_loop(), self._timeouts, self._limit, self._keepalive_s)
        return self._pool

    def _base(self, base_url: str) -> _Origin:
        origin = self._origins.get(base_url)
        if origin is None:
            origin = self._origins[base_url] = _origin(base_url)[0]
        return origin

    async def _send(self, origin: _Origin, request: bytes) -> tuple[_Conn, _Exchange]:
        """Send `request`; returns once the response headers arrived. The caller releases the connection."""
        pool = self._p()
        for fresh in (False, True):
            conn = await pool.acquire(origin, fresh)
            try:
                ex = conn.start(request)
                await ex.headers()
            except BaseException:
                pool.discard(conn)
                raise
            if ex.status:
                return conn, ex
            pool.release(conn)
            if not (conn.reused and not ex.received and not ex.timed_out):
                break  # a stale keep-alive connection is worth one retry, nothing else
        raise ex.failure(started=False)

    async def post_json(self, base_url: str, path: str, body: bytes, headers: Headers | None = None) -> bytes:
        origin = self._base(base_url)
        conn, ex = await self._send(origin, _head("POST", origin.prefix + path, origin, body, headers) + body)
        try:
            data = await ex.read()
        finally:
            self._p().release(conn)
        if ex.status >= 400:
            raise EngineHTTPError(ex.status, data)
        return data

    @asynccontextmanager
    async def stream(
        self, base_url: str, path: str, body: bytes, headers: Headers | None = None
    ) -> AsyncIterator[AsyncIterator[bytes]]:
        origin = self._base(base_url)
        conn, ex = await self._send(origin, _head("POST", origin.prefix + path, origin, body, headers) + body)
        try:
            if ex.status >= 400:
                raise EngineHTTPError(ex.status, await ex.read())
            yield ex.chunks(stream=True)
        finally:
            self._p().release(conn)  # closes it unless the response arrived whole

    async def get_text(self, url: str, timeout_s: float = 2.0, headers: Headers | None = None) -> str:
        origin, target = _origin(url)
        try:
            async with asyncio.timeout(timeout_s):
                conn, ex = await self._send(origin, _head("GET", target, origin, b"", headers))
                try:
                    data = await ex.read()
                finally:
                    self._p().release(conn)
        except TimeoutError as exc:
            raise EngineTimeout(f"{url}: no answer in {timeout_s:g} s") from exc
        except EngineUnavailable as exc:
            raise type(exc)(f"{url}: {exc}") from exc
        if ex.status >= 400:
            raise EngineUnavailable(f"{url}: HTTP {ex.status}")
        return data.decode("utf-8", errors="replace")

    async def aclose(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

