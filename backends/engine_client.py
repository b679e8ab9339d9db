"""Talk to OpenAI-compatible engines (vLLM) over one shared, keep-alive httpx client.

The transport is a measured choice (see BENCHMARKS.md): httpx's API over aiohttp's connection pool
(`httpx_aiohttp`) holds up under concurrency where httpx's own pool collapses on small machines.
Streams pass through chunk by chunk; nothing buffers a whole answer.

Error contract: `EngineUnavailable` means the engine could not be reached or failed before sending a
response (safe to retry elsewhere); `EngineHTTPError` carries the engine's own error status and body.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Literal

import httpx

__all__ = [
    "EngineClient",
    "EngineError",
    "EngineHTTPError",
    "EngineUnavailable",
    "Timeouts",
    "make_http_client",
]


class EngineError(Exception):
    """Base for engine failures."""


class EngineUnavailable(EngineError):
    """No response came back (connect refused, reset, timeout before headers). Safe to fail over."""


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
    pool: float = 10.0


def make_http_client(
    transport: Literal["aiohttp", "httpx"] = "aiohttp",
    timeouts: Timeouts = Timeouts(),
    max_connections: int = 512,
) -> httpx.AsyncClient:
    """One client for all engines; the caller owns it and closes it (`aclose`)."""
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
    timeout = httpx.Timeout(timeouts.read, connect=timeouts.connect, pool=timeouts.pool)
    if transport == "aiohttp":
        from httpx_aiohttp import HttpxAiohttpClient

        return HttpxAiohttpClient(limits=limits, timeout=timeout, trust_env=False)
    return httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False)


_JSON = {"content-type": "application/json"}


class EngineClient:
    """Calls one engine API family over a shared client. Does not own the client."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self._http = http

    async def post_json(
        self, base_url: str, path: str, body: bytes, headers: Mapping[str, str] | None = None
    ) -> bytes:
        """POST a JSON body and return the response body. Raises `EngineUnavailable` / `EngineHTTPError`."""
        try:
            resp = await self._http.post(base_url + path, content=body, headers={**_JSON, **(headers or {})})
        except httpx.TransportError as exc:
            raise EngineUnavailable(f"{base_url}: {type(exc).__name__}: {exc}") from exc
        if resp.status_code >= 400:
            raise EngineHTTPError(resp.status_code, resp.content)
        return resp.content

    @asynccontextmanager
    async def stream(
        self, base_url: str, path: str, body: bytes, headers: Mapping[str, str] | None = None
    ) -> AsyncIterator[AsyncIterator[bytes]]:
        """Open a streaming POST; yields the byte-chunk iterator once the engine sent 2xx headers.

        Leaving the context closes the upstream connection, which makes vLLM abort the request and
        free its KV cache (the client-disconnect path relies on this).
        """
        request = self._http.build_request(
            "POST", base_url + path, content=body, headers={**_JSON, **(headers or {})}
        )
        try:
            resp = await self._http.send(request, stream=True)
        except httpx.TransportError as exc:
            raise EngineUnavailable(f"{base_url}: {type(exc).__name__}: {exc}") from exc
        try:
            if resp.status_code >= 400:
                raise EngineHTTPError(resp.status_code, await resp.aread())
            yield resp.aiter_raw()
        finally:
            await resp.aclose()

    async def get_text(self, url: str, timeout_s: float = 2.0) -> str:
        """GET a small text resource (health, metrics). Raises `EngineUnavailable` on any failure."""
        try:
            resp = await self._http.get(url, timeout=timeout_s)
        except httpx.TransportError as exc:
            raise EngineUnavailable(f"{url}: {type(exc).__name__}") from exc
        if resp.status_code >= 400:
            raise EngineUnavailable(f"{url}: HTTP {resp.status_code}")
        return resp.text
