"""The least a Python streaming relay can do: a reference point for the gateway's streaming overhead.

uvicorn (uvloop, httptools) in front of one upstream, over one shared aiohttp session: each request goes
upstream as is (method, path, body) and the answer's bytes are written back as they arrive. No parsing, routing,
accounting, metrics or failover. `loadtest.bench.overhead` streams through it beside the engine directly
and the gateway, so the gateway's cost splits into the cost of any extra hop on this machine (bare relay vs
direct) and the cost of what the gateway does on top (gateway vs bare relay).

Run: `python -m loadtest.bench.bare_relay --upstream http://127.0.0.1:8000 --port 9100`.
"""

from __future__ import annotations

import argparse

import aiohttp
import uvicorn
from starlette.types import Receive, Scope, Send

from loadtest.fake_upstream import read_body
from loadtest.load.connections import connector

__all__ = ["BareRelay", "main"]


class BareRelay:
    """The ASGI app. The aiohttp session is made lazily, inside the server's event loop."""

    def __init__(self, upstream: str) -> None:
        self._upstream = upstream.rstrip("/")
        self._session: aiohttp.ClientSession | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        body = await read_body(receive)
        if self._session is None:
            self._session = aiohttp.ClientSession(connector=connector(512))
        headers = {"content-type": "application/json"}
        url = self._upstream + scope["path"]
        async with self._session.request(scope["method"], url, data=body, headers=headers) as resp:
            kind = resp.headers.get("content-type", "application/json").encode()
            await send({"type": "http.response.start", "status": resp.status, "headers": [(b"content-type", kind)]})
            async for chunk in resp.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._session is not None:
                    await self._session.close()
                await send({"type": "lifespan.shutdown.complete"})
                return


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--upstream", required=True, help="base URL of the engine, e.g. http://127.0.0.1:8000")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9100)
    args = parser.parse_args(argv)
    uvicorn.run(BareRelay(args.upstream), host=args.host, port=args.port, loop="uvloop", http="httptools",
                log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
