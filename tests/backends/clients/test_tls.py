"""Engines behind TLS: the pool's CA bundle is trusted, a server signed by another CA is refused with a clear
error, a server that requires a client certificate gets the pool's, proxies from the environment are used
only when asked, and a setting naming a file that cannot be used is refused where the pool is built.
Against a real uvicorn server with throw-away certificates (`tests.backends.clients.tls_servers`)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

from backends.clients.connection import ConnectionSettings, ConnectionSettingsError
from backends.clients.pool import Pool
from backends.clients.shared import (
    AiohttpEngineClient,
    EngineClients,
    EngineTLSError,
    EngineUnavailable,
    make_engine_client,
)
from loadtest.fake_upstream import FakeUpstream
from tests.backends.clients.tls_servers import CertificateAuthority, Issued, serve_tls

CHAT = "/v1/chat/completions"
BODY = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
STREAM = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                       "stream": True})


@dataclass(frozen=True)
class Pki:
    ca: CertificateAuthority
    other_ca: CertificateAuthority
    server: Issued
    client: Issued
    stranger: Issued  # a client certificate from the other CA


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    ca, other = CertificateAuthority(directory, "test-ca"), CertificateAuthority(directory, "other-ca")
    return Pki(ca, other, ca.issue("server", server=True), ca.issue("client", server=False),
               other.issue("stranger", server=False))


@pytest.fixture
def tls_url(pki: Pki) -> Iterator[str]:
    with serve_tls(FakeUpstream("m"), pki.server) as url:
        yield url


@pytest.fixture
def mtls_url(pki: Pki) -> Iterator[str]:
    with serve_tls(FakeUpstream("m"), pki.server, client_ca=pki.ca.files.cert) as url:
        yield url


@asynccontextmanager
async def _clients(url: str, settings: ConnectionSettings) -> AsyncIterator[EngineClients]:
    client = make_engine_client()
    client.configure([url], settings)
    try:
        yield client
    finally:
        await client.aclose()


async def _chat_roundtrip(client: EngineClients, url: str) -> None:
    answer = orjson.loads(await client.post_json(url, CHAT, BODY))
    assert answer["choices"][0]["message"]["content"] == "w0 w1 w2"
    async with client.stream(url, CHAT, STREAM) as chunks:
        data = b"".join([chunk async for chunk in chunks])
    assert data.endswith(b"data: [DONE]\n\n")
    assert await client.get_text(url + "/health") == ""


async def test_a_server_signed_by_the_pools_ca_bundle_is_trusted(pki: Pki, tls_url: str) -> None:
    async with _clients(tls_url, ConnectionSettings(ca_bundle=str(pki.ca.files.cert))) as client:
        assert isinstance(client.client_for(tls_url), AiohttpEngineClient)
        await _chat_roundtrip(client, tls_url)


async def test_a_server_signed_by_another_ca_is_refused_with_a_clear_error(pki: Pki, tls_url: str) -> None:
    async with _clients(tls_url, ConnectionSettings(ca_bundle=str(pki.other_ca.files.cert))) as client:
        with pytest.raises(EngineTLSError, match="certificate verify failed") as info:
            await client.post_json(tls_url, CHAT, BODY)
        assert tls_url in str(info.value)
        with pytest.raises(EngineTLSError, match="certificate verify failed"):
            async with client.stream(tls_url, CHAT, STREAM):
                pass
        with pytest.raises(EngineTLSError, match="certificate verify failed"):
            await client.get_text(tls_url + "/health")


async def test_without_a_ca_bundle_the_system_trust_store_refuses_a_private_ca(tls_url: str) -> None:
    client = make_engine_client()
    try:
        with pytest.raises(EngineTLSError, match="certificate verify failed"):
            await client.post_json(tls_url, CHAT, BODY)
    finally:
        await client.aclose()


async def test_a_server_that_requires_a_client_certificate_gets_the_pools(pki: Pki, mtls_url: str) -> None:
    ca = str(pki.ca.files.cert)
    for settings in (ConnectionSettings(ca_bundle=ca, client_cert=str(pki.client.cert),
                                        client_key=str(pki.client.key)),
                     ConnectionSettings(ca_bundle=ca, client_cert=str(pki.client.both))):
        async with _clients(mtls_url, settings) as client:
            await _chat_roundtrip(client, mtls_url)


@pytest.mark.parametrize("identity", ["none", "stranger"])
async def test_a_server_that_requires_a_client_certificate_refuses_none_or_a_strangers(
    pki: Pki, mtls_url: str, identity: str,
) -> None:
    cert = {"none": None, "stranger": str(pki.stranger.both)}[identity]
    async with _clients(mtls_url, ConnectionSettings(ca_bundle=str(pki.ca.files.cert), client_cert=cert)) as client:
        with pytest.raises(EngineUnavailable) as info:
            await client.post_json(mtls_url, CHAT, BODY)
    assert mtls_url in str(info.value)
    hint = f"hangs up like this when it gets none it trusts; client_cert: {cert or 'none'}"
    assert hint in str(info.value)


async def test_a_pool_with_connection_settings_probes_its_replica_healthy(pki: Pki, tls_url: str) -> None:
    client = make_engine_client()
    try:
        trusted = Pool("cloud", [tls_url], client, connection=ConnectionSettings(ca_bundle=str(pki.ca.files.cert)))
        await trusted.probe_once()
        assert trusted.replicas[0].healthy
        client.configure([tls_url], ConnectionSettings(ca_bundle=str(pki.other_ca.files.cert)))
        distrusted = Pool("cloud2", [tls_url], client)
        distrusted.replicas[0].healthy = True
        await distrusted.probe_once()
        assert not distrusted.replicas[0].healthy
    finally:
        await client.aclose()


def test_settings_naming_unusable_files_are_refused_where_the_pool_is_built(pki: Pki, tmp_path: Path) -> None:
    not_pem = tmp_path / "notes.txt"
    not_pem.write_text("not a certificate\n")
    client = make_engine_client()
    url = "https://api.example.test"
    with pytest.raises(ConnectionSettingsError, match=rf"ca_bundle {tmp_path}/missing.pem: .*No such file"):
        client.configure([url], ConnectionSettings(ca_bundle=str(tmp_path / "missing.pem")))
    with pytest.raises(ConnectionSettingsError, match=f"ca_bundle {not_pem}"):
        client.configure([url], ConnectionSettings(ca_bundle=str(not_pem)))
    with pytest.raises(ConnectionSettingsError, match=f"client_cert {pki.client.cert}"):  # its key is elsewhere
        client.configure([url], ConnectionSettings(client_cert=str(pki.client.cert)))
    with pytest.raises(ConnectionSettingsError, match="client_key is set without client_cert"):
        ConnectionSettings(client_key=str(pki.client.key))
    with pytest.raises(ConnectionSettingsError, match=r"missing\.pem"):
        Pool("cloud", [url], client, connection=ConnectionSettings(ca_bundle=str(tmp_path / "missing.pem")))
    with pytest.raises(TypeError, match="EngineClients"):
        Pool("cloud", [url], AiohttpEngineClient(), connection=ConnectionSettings())


class _ConnectProxy:
    """An HTTP CONNECT proxy on loopback that counts the tunnels it opened."""

    def __init__(self) -> None:
        self.tunnels: list[str] = []
        self.url = ""

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        method, target, _ = head.split(b"\r\n")[0].decode().split(" ")
        if method != "CONNECT":
            writer.write(b"HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\n\r\n")
            writer.close()
            return
        host, port = target.rsplit(":", 1)
        if host != "127.0.0.1":  # another library's call in this process, sent here by the test's HTTPS_PROXY
            writer.write(b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n")
            writer.close()
            return
        self.tunnels.append(target)
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    @asynccontextmanager
    async def running(self) -> AsyncIterator[_ConnectProxy]:
        server = await asyncio.start_server(self._on_connect, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        try:
            yield self
        finally:
            server.close()


@pytest.fixture
def proxy_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    for name in [n for n in os.environ if n.lower() in ("http_proxy", "https_proxy", "all_proxy", "no_proxy")]:
        monkeypatch.delenv(name)
    yield monkeypatch


async def test_trust_env_sends_requests_through_the_environments_proxy_and_tls_still_verifies(
    pki: Pki, tls_url: str, proxy_env: pytest.MonkeyPatch,
) -> None:
    ca = str(pki.ca.files.cert)
    async with _ConnectProxy().running() as proxy:
        proxy_env.setenv("HTTPS_PROXY", proxy.url)
        async with _clients(tls_url, ConnectionSettings(ca_bundle=ca)) as client:
            await client.post_json(tls_url, CHAT, BODY)
        assert proxy.tunnels == []  # not asked: no proxy
        async with _clients(tls_url, ConnectionSettings(ca_bundle=ca, trust_env=True)) as client:
            await client.post_json(tls_url, CHAT, BODY)
            assert proxy.tunnels == [tls_url.removeprefix("https://")]
            client.configure([tls_url], ConnectionSettings(ca_bundle=str(pki.other_ca.files.cert), trust_env=True))
            with pytest.raises(EngineTLSError):  # the tunnel does not stand in for the server's certificate
                await client.post_json(tls_url, CHAT, BODY)
        proxy_env.setenv("NO_PROXY", "127.0.0.1")
        async with _clients(tls_url, ConnectionSettings(ca_bundle=ca, trust_env=True)) as client:
            await client.post_json(tls_url, CHAT, BODY)
        assert len(proxy.tunnels) == 2  # NO_PROXY honoured
