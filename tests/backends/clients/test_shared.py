"""Which client each engine URL goes through (`EngineClients`), and idle keep-alive under the engine's own."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator

import orjson
import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from backends.clients.connection import ConnectionSettings
from backends.clients.shared import (
    AiohttpEngineClient,
    EngineClient,
    EngineUnavailable,
    H1EngineClient,
    make_engine_client,
)
from backends.clients.transports import KEEPALIVE_S
from loadtest.fake_upstream import FakeUpstream
from tests.servers import serve

CHAT = "/v1/chat/completions"
BODY = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})


@pytest.mark.parametrize("url", ["http://127.0.0.1:8100", "http://localhost:8100/v1", "http://[::1]:8100",
                                 "http://127.0.0.2:8100/health"])
def test_plain_http_to_this_host_goes_through_the_chosen_local_transport(url: str) -> None:
    assert isinstance(make_engine_client("h1").client_for(url), H1EngineClient)
    assert isinstance(make_engine_client("aiohttp").client_for(url), AiohttpEngineClient)


@pytest.mark.parametrize("url", ["https://127.0.0.1:8100", "https://api.openai.com", "http://10.0.0.7:8000",
                                 "http://cascade-engine-micro-0.cascade-engine-micro.ns.svc.cluster.local:8000",
                                 "HTTPS://API.EXAMPLE.COM/v1"])
def test_tls_and_other_hosts_always_go_through_aiohttp(url: str) -> None:
    assert isinstance(make_engine_client("h1").client_for(url), AiohttpEngineClient)


def test_a_configured_server_on_plain_http_here_goes_through_the_local_transport_unless_it_asks_for_proxies() -> None:
    client = make_engine_client("h1")
    client.configure(["http://127.0.0.1:9000", "http://localhost:9002"], ConnectionSettings())
    assert isinstance(client.client_for("http://127.0.0.1:9000/v1"), H1EngineClient)  # a sidecar: no TLS to set up
    assert isinstance(client.client_for("http://localhost:9002"), H1EngineClient)
    client.configure(["http://127.0.0.1:9000"], ConnectionSettings(trust_env=True))  # a proxy may apply: aiohttp
    assert isinstance(client.client_for("http://127.0.0.1:9000/v1"), AiohttpEngineClient)
    assert isinstance(make_engine_client("aiohttp").client_for("http://127.0.0.1:9000"), AiohttpEngineClient)


def test_a_configured_server_gets_its_own_client_whatever_its_address() -> None:
    client = make_engine_client("h1")
    default = client.client_for("https://api.example.com")
    client.configure(["http://127.0.0.1:9000/", "https://api.example.com"], ConnectionSettings(trust_env=True))
    configured = client.client_for("http://127.0.0.1:9000")
    assert isinstance(configured, AiohttpEngineClient) and configured is not default
    assert client.client_for("http://127.0.0.1:9000/metrics") is configured  # same origin, any path
    assert client.client_for("https://api.example.com:443/v1/models") is configured
    assert isinstance(client.client_for("http://127.0.0.1:9001"), H1EngineClient)  # another port: not configured
    client.configure(["https://other.example.com"], ConnectionSettings(trust_env=True))
    assert client.client_for("https://other.example.com") is configured  # equal settings share one client


async def test_the_h1_client_refuses_https() -> None:
    client = H1EngineClient()
    try:
        with pytest.raises(EngineUnavailable, match="plain http only"):
            await client.post_json("https://127.0.0.1:1", CHAT, BODY)
    finally:
        await client.aclose()


def test_idle_connections_are_kept_less_long_than_the_engines_server_keeps_them() -> None:
    engines_keep_alive_s = inspect.signature(uvicorn.Config).parameters["timeout_keep_alive"].default  # vLLM serves
    # with uvicorn's default
    assert engines_keep_alive_s > KEEPALIVE_S


class _Peers:
    """The fake engine, recording the client address of each chat request."""

    def __init__(self) -> None:
        self.engine = FakeUpstream("m")
        self.peers: list[tuple[str, int]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == CHAT:
            self.peers.append(tuple(scope["client"]))
        await self.engine(scope, receive, send)


@pytest.fixture
def peers() -> Iterator[tuple[_Peers, str]]:
    app = _Peers()
    with serve(app) as url:
        yield app, url


@pytest.mark.parametrize("kind", ["h1", "aiohttp"])
async def test_a_connection_idle_longer_than_the_keep_alive_is_not_reused(
    peers: tuple[_Peers, str], kind: str,
) -> None:
    app, url = peers
    client: EngineClient = H1EngineClient(keepalive_s=0.3) if kind == "h1" else AiohttpEngineClient(keepalive_s=0.3)
    try:
        await client.post_json(url, CHAT, BODY)
        await client.post_json(url, CHAT, BODY)  # at once: the same connection
        await asyncio.sleep(0.6)
        await client.post_json(url, CHAT, BODY)  # after the keep-alive: a new one
    finally:
        await client.aclose()
    assert app.peers[0] == app.peers[1] and app.peers[2] != app.peers[1]
