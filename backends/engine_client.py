"""Talk to OpenAI-compatible engines (vLLM): one shared, keep-alive client per gateway process.

Three transports behind one small protocol, chosen by measurement (BENCHMARKS.md): raw aiohttp (its
connection pool holds up under concurrency), `h1` (`backends.h1_client`: asyncio Protocols and the C parser
httptools; the least CPU per relayed token) and httpx (its own pool; slower under load on small machines,
kept for comparison and for environments that need it).
Streams pass through chunk by chunk; nothing buffers a whole answer.

Error contract: `EngineUnavailable` means no usable response came back (connect refused, reset, timeout
before the body was read): safe to fail over. `EngineHTTPError` carries the engine's own error status
and body. `EngineStreamBroken` means a stream that had started broke off.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Protocol, TypeAlias

import aiohttp
import httpx

from backends.transports import DEFAULT_TRANSPORT, Transport

__all__ = [
    "AiohttpEngineClient",
    "EngineClient",
    "EngineError",
    "EngineHTTPError",
    "EngineStreamBroken",
    "EngineUnavailable",
    "HttpxEngineClient",
    "Timeouts",
    "make_engine_client",
]


Headers: TypeAlias = Mapping[str, str]


class EngineError(Exception):
    """Base for engine failures."""


class EngineUnavailable(EngineError):
    """No response came back (connect refused, reset, timeout before headers). Safe to fail over."""


class EngineTimeout(EngineUnavailable):
    """The engine did not answer in time: it may be alive but saturated (unlike a refused connection)."""


class EngineStreamBroken(EngineError):
    """A stream that had started to arrive broke off (connection lost or too long a gap)."""


class EngineHTTPError(EngineError):
    """The engine answered with an HTTP error status."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"engine returned HTTP {status}")
        self.status = status
        self.body = body


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Seconds. `read` bounds the gap between two chunks of a stream, not the whole answer."""

    connect: float = 3.0
    read: float = 120.0


class EngineClient(Protocol):
    """What the gateway needs from an engine connection pool. The owner calls `aclose()`."""

    async def post_json(self, base_url: str, path: str, body: bytes, headers: Headers | None = None) -> bytes: ...

    def stream(
        self, base_url: str, path: str, body: bytes, headers: Headers | None = None
    ) -> AbstractAsyncContextManager[AsyncIterator[bytes]]:
        """Open a streaming POST; yields the chunk iterator once the engine sent 2xx headers. Leaving the
        context early drops the connection, which makes vLLM abort the request and free its KV cache."""
        ...

    async def get_text(self, url: str, timeout_s: float = 2.0, headers: Headers | None = None) -> str: ...

    async def aclose(self) -> None: ...


_JSON = {"content-type": "application/json"}


def _with_json(headers: Headers | None) -> Headers:
    return _JSON if not headers else {**_JSON, **headers}
_AIO_ERRORS = (aiohttp.ClientError, TimeoutError, OSError)


class AiohttpEngineClient:
    """aiohttp's pool. The session is created lazily, inside the running event loop."""

    def __init__(self, timeouts: Timeouts = Timeouts(), max_connections: int = 512) -> None:
        self._timeouts = timeouts
        self._limit = max_connections
        self._session: aiohttp.ClientSession | None = None

    def _s(self) -> aiohttp.ClientSession:
        if self._session is None:
            t = self._timeouts
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._limit, ttl_dns_cache=300),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=t.connect, sock_read=t.read),
                auto_decompress=False, skip_auto_headers=("User-Agent",),
            )
        return self._session

    async def post_json(self, base_url: str, path: str, body: bytes, headers: Headers | None = None) -> bytes:
        try:
            async with self._s().post(base_url + path, data=body, headers=_with_json(headers)) as resp:
                data = await resp.read()
        except _AIO_ERRORS as exc:
            raise EngineUnavailable(f"{base_url}: {type(exc).__name__}: {exc}") from exc
        if resp.status >= 400:
            raise EngineHTTPError(resp.status, data)
        return data

    @asynccontextmanager
    async def stream(
        self, base_url: str, path: str, body: bytes, headers: Headers | None = None
    ) -> AsyncIterator[AsyncIterator[bytes]]:
        try:
            resp = await self._s().post(base_url + path, data=body, headers=_with_json(headers))
        except _AIO_ERRORS as exc:
            raise EngineUnavailable(f"{base_url}: {type(exc).__name__}: {exc}") from exc
        try:
            if resp.status >= 400:
                raise EngineHTTPError(resp.status, await resp.read())
            yield _aio_chunks(resp)
        finally:
            if resp.content.at_eof():
                resp.release()  # complete: the connection goes back to the pool
            else:
                resp.close()  # cut short: drop the connection so the engine aborts the request

    async def get_text(self, url: str, timeout_s: float = 2.0, headers: Headers | None = None) -> str:
        try:
            async with self._s().get(url, timeout=aiohttp.ClientTimeout(total=timeout_s), headers=headers) as resp:
                text = await resp.text()
        except TimeoutError as exc:
            raise EngineTimeout(f"{url}: no answer in {timeout_s:g} s") from exc
        except _AIO_ERRORS as exc:
            raise EngineUnavailable(f"{url}: {type(exc).__name__}") from exc
        if resp.status >= 400:
            raise EngineUnavailable(f"{url}: HTTP {resp.status}")
        return text

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


async def _aio_chunks(resp: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    try:
        async for chunk in resp.content.iter_any():
            yield chunk
    except _AIO_ERRORS as exc:
        raise EngineStreamBroken(f"{type(exc).__name__}: {exc}") from exc


class HttpxEngineClient:
    """httpx's own pool (measured slower under concurrency; see BENCHMARKS.md)."""

    def __init__(self, timeouts: Timeouts = Timeouts(), max_connections: int = 512) -> None:
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        timeout = httpx.Timeout(timeouts.read, connect=timeouts.connect, pool=timeouts.connect)
        self._http = httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False)

    async def post_json(self, base_url: str, path: str, body: bytes, headers: Headers | None = None) -> bytes:
        try:
            resp = await self._http.post(base_url + path, content=body, headers=_with_json(headers))
        except httpx.TransportError as exc:
            raise EngineUnavailable(f"{base_url}: {type(exc).__name__}: {exc}") from exc
        if resp.status_code >= 400:
            raise EngineHTTPError(resp.status_code, resp.content)
        return resp.content

    @asynccontextmanager
    async def stream(
        self, base_url: str, path: str, body: bytes, headers: Headers | None = None
    ) -> AsyncIterator[AsyncIterator[bytes]]:
        request = self._http.build_request("POST", base_url + path, content=body, headers=_with_json(headers))
        try:
            resp = await self._http.send(request, stream=True)
        except httpx.TransportError as exc:
            raise EngineUnavailable(f"{base_url}: {type(exc).__name__}: {exc}") from exc
        try:
            if resp.status_code >= 400:
                raise EngineHTTPError(resp.status_code, await resp.aread())
            yield _httpx_chunks(resp)
        finally:
            await resp.aclose()

    async def get_text(self, url: str, timeout_s: float = 2.0, headers: Headers | None = None) -> str:
        try:
            resp = await self._http.get(url, timeout=timeout_s, headers=headers)
        except httpx.TimeoutException as exc:
            raise EngineTimeout(f"{url}: no answer in {timeout_s:g} s") from exc
        except httpx.TransportError as exc:
            raise EngineUnavailable(f"{url}: {type(exc).__name__}") from exc
        if resp.status_code >= 400:
            raise EngineUnavailable(f"{url}: HTTP {resp.status_code}")
        return resp.text

    async def aclose(self) -> None:
        await self._http.aclose()


async def _httpx_chunks(resp: httpx.Response) -> AsyncIterator[bytes]:
    try:
        async for chunk in resp.aiter_raw():
            yield chunk
    except (httpx.TransportError, httpx.StreamError) as exc:
        raise EngineStreamBroken(f"{type(exc).__name__}: {exc}") from exc


def make_engine_client(transport: Transport = DEFAULT_TRANSPORT, timeouts: Timeouts = Timeouts(),
                       max_connections: int = 512) -> EngineClient:
    """One client for all engines; the caller owns it and closes it (`aclose`). `h1` is the lean client of
    `backends.h1_client` (asyncio Protocols and httptools)."""
    if transport == "aiohttp":
        return AiohttpEngineClient(timeouts, max_connections)
    if transport == "h1":
        from backends.h1_client import H1EngineClient  # it imports this module's errors

        return H1EngineClient(timeouts, max_connections)
    return HttpxEngineClient(timeouts, max_connections)
