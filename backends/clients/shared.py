"""Talk to OpenAI-compatible engines (vLLM): one shared client per gateway process, which picks the
connection for each URL by where it goes.

- Plain http to a loopback address (the engines the supervisor starts on this host, and a remote pool's server
  on this host, a sidecar, unless its `connection:` block asks for proxies from the environment): the chosen
  transport, `h1` by default (`backends.clients.h1`: the least CPU per request, BENCHMARKS.md "Engine clients").
  A CA bundle or a client certificate has nothing to do on plain http, so only `trust_env` changes the choice.
- The other servers of a remote pool whose settings were given (`EngineClients.configure`, which `Pool` calls
  with the policy's `connection:` block): aiohttp with those settings (CA bundle, client certificate,
  proxies from the environment when `trust_env`).
- Anything else (https, another host): aiohttp with the system's CAs and no proxy.

So a hand-written client never talks to another machine. Idle connections are kept under the engine's own
keep-alive (`backends.clients.transports.KEEPALIVE_S`). Streams pass through chunk by chunk; nothing buffers a whole
answer. Errors follow `backends.clients.protocol` (re-exported here).
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import AsyncIterator, Iterable
from contextlib import AbstractAsyncContextManager
from urllib.parse import urlsplit

from backends.clients.connection import DEFAULT_SETTINGS, ConnectionSettings
from backends.clients.h1 import H1EngineClient
from backends.clients.protocol import (
    DEFAULT_TIMEOUTS,
    EngineClient,
    EngineError,
    EngineHTTPError,
    EngineStreamBroken,
    EngineTimeout,
    EngineTLSError,
    EngineUnavailable,
    Headers,
    Timeouts,
)
from backends.clients.transports import DEFAULT_TRANSPORT, Transport
from backends.clients.via_aiohttp import AiohttpEngineClient

__all__ = [
    "AiohttpEngineClient",
    "EngineClient",
    "EngineClients",
    "EngineError",
    "EngineHTTPError",
    "EngineStreamBroken",
    "EngineTLSError",
    "EngineTimeout",
    "EngineUnavailable",
    "H1EngineClient",
    "Headers",
    "Timeouts",
    "is_loopback",
    "make_engine_client",
    "origin_of",
]

log = logging.getLogger("cascade.engine_client")

_Origin = tuple[str, str, int]  # scheme, host, port
_MAX_ROUTES = 4096  # remembered URL -> client choices; forgotten all at once beyond this


def origin_of(url: str) -> _Origin:
    """Scheme, lower-case host and port (the scheme's default when absent) of an absolute URL."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, parts.hostname or "", parts.port or (443 if scheme == "https" else 80)


def is_loopback(host: str) -> bool:
    """`localhost` or a loopback IP address (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class EngineClients:
    """An `EngineClient` that hands each request to the client for its URL's origin (see the module's
    docstring). Owns every client it made; `aclose` closes them all. `max_connections` is per client."""

    def __init__(self, local: Transport = DEFAULT_TRANSPORT, timeouts: Timeouts = DEFAULT_TIMEOUTS,
                 max_connections: int = 512) -> None:
        self._timeouts = timeouts
        self._limit = max_connections
        self._by_settings: dict[ConnectionSettings, AiohttpEngineClient] = {}
        self._h1 = H1EngineClient(timeouts, max_connections) if local == "h1" else None
        self._configured: dict[_Origin, ConnectionSettings] = {}
        self._routes: dict[str, EngineClient] = {}

    def configure(self, urls: Iterable[str], settings: ConnectionSettings) -> None:
        """Connect to the origins of `urls` with `settings` from now on (a remote pool's servers). Builds the
        client now, so a file it cannot use raises `ConnectionSettingsError` here. An origin has one set of
        settings: configuring it again replaces them (with a warning if they differ)."""
        self._aiohttp(settings)
        for url in urls:
            origin = origin_of(url)
            before = self._configured.get(origin)
            if before is not None and before != settings:
                log.warning("%s://%s:%d: connection settings replaced (two pools on one server?)", *origin)
            self._configured[origin] = settings
        self._routes.clear()

    def client_for(self, url: str) -> EngineClient:
        """The client that requests to `url` (a base URL or a full one) go through."""
        client = self._routes.get(url)
        if client is None:
            if len(self._routes) >= _MAX_ROUTES:
                self._routes.clear()
            client = self._routes[url] = self._choose(origin_of(url))
        return client

    def _choose(self, origin: _Origin) -> EngineClient:
        settings = self._configured.get(origin)
        scheme, host, _ = origin
        local = scheme == "http" and is_loopback(host) and (settings is None or not settings.trust_env)
        if local and self._h1 is not None:
            return self._h1
        return self._aiohttp(settings or DEFAULT_SETTINGS)

    def _aiohttp(self, settings: ConnectionSettings) -> AiohttpEngineClient:
        client = self._by_settings.get(settings)
        if client is None:
            client = self._by_settings[settings] = AiohttpEngineClient(self._timeouts, self._limit, settings)
        return client

    async def post_json(self, base_url: str, path: str, body: bytes, headers: Headers | None = None) -> bytes:
        return await self.client_for(base_url).post_json(base_url, path, body, headers)

    def stream(
        self, base_url: str, path: str, body: bytes, headers: Headers | None = None
    ) -> AbstractAsyncContextManager[AsyncIterator[bytes]]:
        return self.client_for(base_url).stream(base_url, path, body, headers)

    async def get_text(self, url: str, timeout_s: float = 2.0, headers: Headers | None = None) -> str:
        return await self.client_for(url).get_text(url, timeout_s, headers)

    async def aclose(self) -> None:
        clients: list[EngineClient] = [*self._by_settings.values(), *([self._h1] if self._h1 else [])]
        self._by_settings.clear()
        self._routes.clear()
        for client in clients:
            await client.aclose()


def make_engine_client(transport: Transport = DEFAULT_TRANSPORT, timeouts: Timeouts = DEFAULT_TIMEOUTS,
                       max_connections: int = 512) -> EngineClients:
    """One client for all engines; the caller owns it and closes it (`aclose`). `transport` is the client for
    plain-http engines on this host; everything else goes through aiohttp (see the module's docstring)."""
    return EngineClients(transport, timeouts, max_connections)
