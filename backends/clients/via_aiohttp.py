"""The aiohttp engine client: every remote or TLS engine goes through it (`backends.clients.shared` routes).

One `aiohttp.ClientSession` per instance, created lazily inside the running event loop, with the
`ConnectionSettings` it was built with: the TLS context (CA bundle, client certificate) and whether proxies
come from the environment. Idle connections are kept `keepalive_s` (under the engine's own keep-alive, so
that the gateway never writes a request onto a connection the engine is closing). No cookie jar: engines
serve many tenants through one session, and a cookie one answer sets must not ride along on the next.
Errors follow `backends.clients.protocol`'s contract; a failed TLS handshake is `EngineTLSError`.
"""

from __future__ import annotations

import errno
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp

from backends.clients.connection import DEFAULT_SETTINGS, ConnectionSettings, ssl_context
from backends.clients.protocol import (
    DEFAULT_TIMEOUTS,
    EngineHTTPError,
    EngineStreamBroken,
    EngineTimeout,
    EngineTLSError,
    EngineUnavailable,
    Headers,
    Timeouts,
    with_json,
)
from backends.clients.transports import KEEPALIVE_S

__all__ = ["AiohttpEngineClient"]

_ERRORS = (aiohttp.ClientError, TimeoutError, OSError)


def _unavailable(where: str, exc: BaseException, settings: ConnectionSettings) -> EngineUnavailable:
    """The contract's error for a request that got no usable response; TLS failures say why. A TLS 1.3
    server that wants a client certificate checks it after the handshake and just hangs up: say so."""
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, ssl.SSLError):  # aiohttp keeps the ssl error inside
        cause = getattr(cause, "certificate_error", None) or getattr(cause, "os_error", None) or cause.__cause__
    if isinstance(exc, aiohttp.ClientSSLError) or isinstance(cause, ssl.SSLError):
        return EngineTLSError(f"{where}: TLS handshake failed: {cause or exc}")
    hint = ""
    reset = isinstance(exc, aiohttp.ClientOSError) and exc.errno == errno.ECONNRESET
    if (isinstance(exc, aiohttp.ServerDisconnectedError) or reset) and where.startswith("https:"):
        # closed or reset, depending on timing: both are how the refusal shows
        hint = (" (a TLS server that requires a client certificate hangs up like this when it gets none it "
                f"trusts; client_cert: {settings.client_cert or 'none'})")
    return EngineUnavailable(f"{where}: {type(exc).__name__}: {exc}{hint}")


class AiohttpEngineClient:
    """aiohttp's pool, for the engines one `ConnectionSettings` applies to. `max_connections` in all."""

    def __init__(self, timeouts: Timeouts = DEFAULT_TIMEOUTS, max_connections: int = 512,
                 settings: ConnectionSettings = DEFAULT_SETTINGS, keepalive_s: float = KEEPALIVE_S) -> None:
        """Reads the settings' files now: raises `ConnectionSettingsError` if one cannot be used."""
        self._timeouts = timeouts
        self._limit = max_connections
        self._settings = settings
        self._keepalive_s = keepalive_s
        self._ssl: ssl.SSLContext = ssl_context(settings)
        self._session: aiohttp.ClientSession | None = None

    def _s(self) -> aiohttp.ClientSession:
        if self._session is None:
            t = self._timeouts
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._limit, ttl_dns_cache=300, ssl=self._ssl,
                                               keepalive_timeout=self._keepalive_s),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=t.connect, sock_read=t.read),
                auto_decompress=False, skip_auto_headers=("User-Agent",), trust_env=self._settings.trust_env,
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._session

    async def post_json(self, base_url: str, path: str, body: bytes, headers: Headers | None = None) -> bytes:
        try:
            async with self._s().post(base_url + path, data=body, headers=with_json(headers)) as resp:
                data = await resp.read()
        except _ERRORS as exc:
            raise _unavailable(base_url, exc, self._settings) from exc
        if resp.status >= 400:
            raise EngineHTTPError(resp.status, data)
        return data

    @asynccontextmanager
    async def stream(
        self, base_url: str, path: str, body: bytes, headers: Headers | None = None
    ) -> AsyncIterator[AsyncIterator[bytes]]:
        try:
            resp = await self._s().post(base_url + path, data=body, headers=with_json(headers))
        except _ERRORS as exc:
            raise _unavailable(base_url, exc, self._settings) from exc
        try:
            if resp.status >= 400:
                    raise EngineHTTPError(resp.status, await resp.read())
            yield _chunks(resp)
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
        except _ERRORS as exc:
            raise _unavailable(url, exc, self._settings) from exc
        if resp.status >= 400:
            raise EngineUnavailable(f"{url}: HTTP {resp.status}")
        return text

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


async def _chunks(resp: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    try:
        async for chunk in resp.content.iter_any():
            yield chunk
    except _ERRORS as exc:
        raise EngineStreamBroken(f"{type(exc).__name__}: {exc}") from exc
