"""A request body read against a size limit: refused at once when its declared length passes the limit, else counted
as it is read, so an oversized body is never held whole (413, `BodyTooLarge`). One rule for every endpoint that
reads a body (chat and the other OpenAI routes, feedback, batch file uploads); each names what it reads and what is
allowed."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass

from gateway.errors import BodyTooLarge

__all__ = ["BodyLimit"]


@dataclass(frozen=True)
class BodyLimit:
    """At most `limit` bytes of `what`; `allowed` says what the client may send (default: the limit itself)."""

    limit: int
    what: str = "request body"
    allowed: str = ""
    param: str | None = None

    def check_declared(self, headers: Mapping[str, str]) -> None:
        """BodyTooLarge when the request's content-length already passes the limit."""
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.limit:
            raise self._error(f"{self.what} is {declared} bytes")

    def passed(self) -> BodyTooLarge:
        """The error of a body whose bytes read passed the limit."""
        return self._error(f"{self.what} passed {self.limit} bytes")

    async def bounded(self, chunks: AsyncIterator[bytes]) -> AsyncGenerator[bytes]:
        """`chunks` as they come, BodyTooLarge as soon as their total passes the limit."""
        read = 0
        async for chunk in chunks:
            read += len(chunk)
            if read > self.limit:
                raise self.passed()
            yield chunk

    async def read(self, chunks: AsyncIterator[bytes]) -> bytes:
        """The whole body of `chunks`, bounded."""
        return b"".join([chunk async for chunk in self.bounded(chunks)])

    def _error(self, size: str) -> BodyTooLarge:
        return BodyTooLarge(f"{size}; {self.allowed or f'the limit is {self.limit} bytes'}", param=self.param)
