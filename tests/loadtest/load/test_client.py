"""The load client's own count of the streams being answered (`send_one(answering=...)`), against a small aiohttp
server in this process that holds its stream open until the test lets it finish."""

from __future__ import annotations

import asyncio
from collections import Counter

import aiohttp
import orjson
from aiohttp import web
from aiohttp.test_utils import TestServer

from loadtest.load.client import RequestSpec, send_one

_CHUNK = b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'


def _app(release: asyncio.Event) -> web.Application:
    async def chat(request: web.Request) -> web.StreamResponse:
        if (await request.json()).get("refuse"):
            return web.json_response({"error": {"message": "over budget"}}, status=429,
                                     headers={"x-cascade-pool": "micro"})
        resp = web.StreamResponse(headers={"x-cascade-pool": "micro", "content-type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(_CHUNK)
        await release.wait()
        await resp.write(_CHUNK + b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


def _spec(url: str, refuse: bool = False) -> RequestSpec:
    body = orjson.dumps({"model": "auto", "stream": True, "refuse": refuse})
    return RequestSpec(url, body, {"content-type": "application/json"}, "run", "short-easy", "t", stream=True)


async def test_a_stream_counts_as_answered_from_its_headers_to_its_end() -> None:
    release = asyncio.Event()
    answering: Counter[str] = Counter()
    async with TestServer(_app(release)) as server, aiohttp.ClientSession() as session:
        url = str(server.make_url("/v1/chat/completions"))
        sending = asyncio.create_task(send_one(session, _spec(url), 0.0, answering))
        async with asyncio.timeout(5):
            while answering["micro"] == 0:
                await asyncio.sleep(0.01)
        assert answering == Counter(micro=1) and not sending.done()  # the first chunk came, the stream still open
        release.set()
        sample = await sending
        refused = await send_one(session, _spec(url, refuse=True), 0.0, answering)
    assert sample.ok and sample.pool == "micro" and len(sample.gaps_s) == 1
    assert answering["micro"] == 0  # done: no longer counted
    assert refused.status == 429 and refused.error == "HTTP 429: over budget"
    assert answering["micro"] == 0  # a refusal is never counted as answered
