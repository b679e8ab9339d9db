"""The connection pool of every load-test client (the load generator, the stream client, the saturation check, the
bare relay, the scorer bench's gateway mode, the chaos scenario's readiness poll, the speculative-decoding bench).

Idle connections are kept `backends.clients.transports.KEEPALIVE_S` (4 s), as the gateway's engine client keeps them:
less long than the servers measured keep theirs (uvicorn closes an idle one after 5 s). aiohttp's default keeps them
15 s, and a request written onto a connection the server is closing fails with `ServerDisconnectedError` (fc6 of
2026-12-07: the saturation test).
"""

from __future__ import annotations

import aiohttp

from backends.clients.transports import KEEPALIVE_S

__all__ = ["connector"]


def connector(limit: int) -> aiohttp.TCPConnector:
    """A pool of at most `limit` connections, idle ones kept `KEEPALIVE_S`."""
    return aiohttp.TCPConnector(limit=limit, keepalive_timeout=KEEPALIVE_S)
