"""`BodyLimit`: the one rule every endpoint reads a body by (declared length, then bytes counted as read)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gateway.api.body_limit import BodyLimit
from gateway.errors import BodyTooLarge


async def _chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def test_a_body_within_the_limit_is_read_whole() -> None:
    bound = BodyLimit(10)
    bound.check_declared({"content-length": "10"})
    assert await bound.read(_chunks(b"12345", b"67890")) == b"1234567890"


async def test_a_declared_length_past_the_limit_is_refused_before_reading() -> None:
    with pytest.raises(BodyTooLarge, match="request body is 11 bytes; the limit is 10 bytes"):
        BodyLimit(10).check_declared({"content-length": "11"})


async def test_bytes_past_the_limit_stop_the_read_at_once_saying_what_is_allowed() -> None:
    bound = BodyLimit(10, "the upload", "a batch file may have 8 bytes", param="file")
    seen: list[bytes] = []
    with pytest.raises(BodyTooLarge, match="the upload passed 10 bytes; a batch file may have 8 bytes") as caught:
        async for chunk in bound.bounded(_chunks(b"123456", b"789012", b"never read")):
            seen.append(chunk)
    assert seen == [b"123456"] and caught.value.status == 413 and b'"param":"file"' in caught.value.body()
