"""What every engine client is and raises: the `EngineClient` protocol, its error tree and its timeouts.

A light module (no HTTP library) that the clients (`backends.clients.via_aiohttp`, `backends.clients.h1`) and the
router in front of them (`backends.clients.shared`) all import, so none of them imports another's errors.

Error contract: `EngineUnavailable` means no usable response came back (connect refused, reset, TLS refused,
timeout before the body was read): safe to fail over. `EngineHTTPError` carries the engine's own error status
and body. `EngineStreamBroken` means a stream that had started broke off.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol, TypeAlias

__all__ = [
    "DEFAULT_TIMEOUTS",
    "JSON_HEADERS",
    "EngineClient",
    "EngineError",
    "EngineHTTPError",
    "EngineStreamBroken",
    "EngineTLSError",
    "EngineTimeout",
    "EngineUnavailable",
    "Headers",
    "Timeouts",
    "with_json",
]

Headers: TypeAlias = Mapping[str, str]


class EngineError(Exception):
    """Base for engine failures."""


class EngineUnavailable(EngineError):
    """No response came back (connect refused, reset, timeout before headers). Safe to fail over."""


class EngineTimeout(EngineUnavailable):
    """The engine did not answer in time: it may be alive but saturated (unlike a refused connection)."""


class EngineTLSError(EngineUnavailable):
    """The TLS handshake failed: the server's certificate is not trusted (wrong or missing CA bundle, wrong
    host name) or the server refused our client certificate (none configured, or not one it trusts). A
    configuration problem, not a load problem: retrying the same replica will not help."""


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


DEFAULT_TIMEOUTS = Timeouts()


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


JSON_HEADERS: Headers = {"content-type": "application/json"}


def with_json(headers: Headers | None) -> Headers:
    """The JSON content type, overridden by the caller's headers."""
    return JSON_HEADERS if not headers else {**JSON_HEADERS, **headers}
