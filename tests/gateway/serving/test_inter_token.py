"""Inter-token latency from a stream whose engine sends several tokens per network chunk: each content event gets
its share of the chunk's gap (`StreamRelay._content_arrived`), not 0 for all but the first."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

from gateway.serving.sending.streaming import StreamRelay


def _token(text: str) -> bytes:
    return b'data: {"choices":[{"index":0,"delta":{"content":"' + text.encode() + b'"}}]}\n\n'


_ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'  # no content: no token
_DONE = b"data: [DONE]\n\n"
_GAP_S = 0.06


async def _engine() -> AsyncIterator[bytes]:
    """First token, then 4 tokens in one chunk, then one token whose event is split over two chunks."""
    yield _ROLE + _token("a")
    await asyncio.sleep(_GAP_S)
    yield _token("b") + _token("c") + _token("d") + _token("e")
    await asyncio.sleep(_GAP_S)
    yield _token("f")[:20]
    yield _token("f")[20:] + _DONE


def test_tokens_batched_in_one_chunk_share_its_gap() -> None:
    finished: list[StreamRelay] = []
    relay = StreamRelay(b"", _engine(), AsyncExitStack(), False, 0.0, finished.append)

    async def read() -> bytes:
        return b"".join([chunk async for chunk in relay.body()])

    body = asyncio.run(read())
    assert finished == [relay] and relay.completed and relay.generated_text() == "abcdef"
    assert body.count(b'"content":"') == 7  # relayed whole, the split event rejoined
    gaps = relay.gaps_s
    assert len(gaps) == 5  # one per token after the first
    assert gaps[0] == gaps[1] == gaps[2] == gaps[3]  # the 4 tokens of one chunk share its gap
    assert _GAP_S / 4 <= gaps[0] < _GAP_S  # a quarter of the chunk's gap each, not the gap then 0, 0, 0
    assert gaps[4] >= _GAP_S  # timed when the split event was whole, from the chunk before it
    assert sum(gaps[:4]) >= _GAP_S  # together they span the decode time between the chunks
