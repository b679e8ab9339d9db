"""The gateway's Redis client packs commands with hiredis: the bytes redis-py's own packer gives, the same
refusal of what Redis cannot take, and commands that work against the real server."""

from __future__ import annotations

import uuid

import pytest
import redis.asyncio as aioredis
from redis.exceptions import DataError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.typing import EncodableT

from gateway.redis_client import (
    HiredisConnection,
    HiredisSSLConnection,
    HiredisUnixConnection,
    close_quietly,
    redis_from_url,
)
from tests.conftest import SHARED_URL

ARGS = ("EVALSHA", "0123abcd", 3, "k:1", "k:2", "k:3", 0, 12, 2.5, 0.1, 1e-07, 1_800_000_000.123, -0.0,
        123456789012345, "héllo wörld", b"\x00\xffbytes", "", "x" * 10_000)


def test_the_bytes_are_redis_pys_own() -> None:
    python, hiredis = aioredis.Connection(), HiredisConnection()
    assert b"".join(hiredis.pack_command(*ARGS)) == b"".join(python.pack_command(*ARGS))
    assert b"".join(hiredis.pack_command("CONFIG GET", "maxmemory")) == b"".join(
        python.pack_command("CONFIG GET", "maxmemory"))  # a command of two words is split, as before
    odd: list[tuple[EncodableT, ...]] = [("SET", "k", memoryview(b"ab")), ("SET", "k", bytearray(b"ab")),
                                         (b"SET", "k", 1), ("SET\tX", "k"), (b"CONFIG GET", "x")]
    for args in odd:  # what hiredis does not take, or a command to split
        assert b"".join(hiredis.pack_command(*args)) == b"".join(python.pack_command(*args))
    pipeline = [("SET", "a", 1.5), ("HSET", "h", "f", "v", "n", 3)]
    assert b"".join(hiredis.pack_commands(pipeline)) == b"".join(python.pack_commands(pipeline))


@pytest.mark.parametrize("bad", [None, True, object()])
def test_what_redis_cannot_take_is_refused_as_before(bad: object) -> None:
    for conn in (aioredis.Connection(), HiredisConnection()):
        with pytest.raises(DataError):
            conn.pack_command("SET", "k", bad)  # type: ignore[arg-type]


def test_each_url_scheme_keeps_its_transport() -> None:
    classes = {url: redis_from_url(url).connection_pool.connection_class
               for url in ("redis://h:1/0", "rediss://h:1/0", "unix:///tmp/redis.sock")}
    assert classes == {"redis://h:1/0": HiredisConnection, "rediss://h:1/0": HiredisSSLConnection,
                       "unix:///tmp/redis.sock": HiredisUnixConnection}
    assert issubclass(HiredisSSLConnection, aioredis.SSLConnection)


@pytest.mark.redis
async def test_commands_and_pipelines_round_trip_on_the_real_server() -> None:
    client = redis_from_url(SHARED_URL)
    key = f"test:{uuid.uuid4().hex}"
    try:
        async with client.pipeline(transaction=False) as pipe:
            pipe.hset(key, mapping={"text": "héllo", "n": 3, "x": 0.1, "raw": b"\x00\xff"})
            pipe.hincrby(key, "n", 2)
            pipe.expire(key, 60)
            await pipe.execute()
        assert await client.hgetall(key) == {b"text": "héllo".encode(), b"n": b"5", b"x": b"0.1", b"raw": b"\x00\xff"}
        assert await client.eval("return ARGV[1] .. ARGV[2]", 0, "a b", 7) == b"a b7"
    finally:
        await client.delete(key)
        await client.aclose()


async def test_a_connection_that_will_not_close_in_time_is_logged_not_raised(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    client = redis_from_url(SHARED_URL, socket_timeout=2.0)
    assert await client.ping()

    async def stalled(*_: object) -> None:  # what redis-py raises when the host stalls past its close timeout
        raise RedisTimeoutError("Timed out closing connection after 0.5")

    monkeypatch.setattr(client.connection_pool, "disconnect", stalled)
    await close_quietly(client, "the ledger")  # the shutdown goes on to close what comes after it
    assert "closing the ledger's Redis connections failed: Timed out closing connection" in caplog.text
