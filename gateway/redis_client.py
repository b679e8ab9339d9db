"""The gateway's Redis client, for one server or a Redis Cluster, chosen by the URL.

`redis://host:port/db` (also `rediss://`, `unix://`) is one server: `redis.asyncio.Redis`.
`redis+cluster://host:port` (TLS: `rediss+cluster://`) is a Redis Cluster: `redis.asyncio.cluster.RedisCluster`,
which learns the slot map from that node (any one of the cluster's nodes will do), sends each command to the
master of its key's slot and follows MOVED/ASK when slots move. A cluster has only database 0.

On a cluster every multi-key command or script must keep its keys in one slot (hash tags). Which of the
gateway's Redis users do is listed in docs/ledger.md ("Redis Cluster").

`REDIS_FAILURES` is what a Redis user catches to treat Redis as unreachable: redis-py's cluster client raises
`RedisClusterException`, which is not a `RedisError`, when no node of the cluster answers.

Commands to one server are packed by hiredis (redis-py's own `HiredisRespSerializer`, what its synchronous client
uses; its asyncio client packs in Python): the same bytes for every argument the gateway sends (str, bytes, int,
float), about 10x faster for the ledger's record script with its 60-odd arguments, which was 8.7% of the
gateway's CPU at saturation (BENCHMARKS.md, the tail at saturation).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.connection import HiredisRespSerializer
from redis.exceptions import RedisClusterException, RedisError
from redis.typing import EncodableT
from redis.utils import HIREDIS_AVAILABLE

if HIREDIS_AVAILABLE:
    import hiredis

__all__ = [
    "CLUSTER_SCHEMES",
    "REDIS_FAILURES",
    "HiredisConnection",
    "HiredisSSLConnection",
    "HiredisUnixConnection",
    "close_quietly",
    "is_cluster_url",
    "redis_from_url",
    "run_with_redis",
    "safe_url",
]

T = TypeVar("T")
_log = logging.getLogger(__name__)
REDIS_FAILURES: tuple[type[Exception], ...] = (RedisError, RedisClusterException, OSError)

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}  # cluster scheme -> redis-py's scheme


async def close_quietly(client: aioredis.Redis, what: str) -> None:
    """Close `client` at shutdown; Redis failing to close a connection in time (a stalled host) is logged, not
    raised, so what the caller closes after it (metrics, engines) still closes. Nothing is lost: whatever was to be
    written went through or into the outbox before."""
    try:
        await client.aclose()
    except REDIS_FAILURES as exc:
        _log.warning("closing %s's Redis connections failed: %s", what, exc)


def is_cluster_url(url: str) -> bool:
    """Whether `url` names a Redis Cluster (`redis+cluster://` or `rediss+cluster://`)."""
    return url.split("://", 1)[0].lower() in CLUSTER_SCHEMES


class _HiredisPacking:
    """Connection mixin: commands packed by hiredis; a type it cannot pack is redis-py's `DataError`, as before.

    A command of one word whose arguments hiredis takes as they are (str, bytes, int, float) goes straight to
    `hiredis.pack_command`: redis-py's serializer would first rebuild the argument tuple in Python, which for the
    ledger's record script cost three times the packing itself. Anything else (a command of two words, a bytearray,
    a type Redis cannot take) goes through redis-py's serializer, which splits, converts or refuses it as before."""

    _packer = HiredisRespSerializer()  # type: ignore[no-untyped-call]  # redis-py leaves its __init__ untyped

    def pack_command(self, *args: EncodableT) -> list[bytes]:
        head = args[0].encode() if isinstance(args[0], str) else args[0]
        if isinstance(head, bytes) and head.split() == [head]:  # one word: redis-py would not split it
            try:
                return [hiredis.pack_command(args)]  # type: ignore[arg-type]  # its stub: str, int, float, bytes
            except TypeError:
                pass  # a bytearray, or what Redis cannot take: redis-py's serializer converts or refuses it
        packed: list[bytes] = self._packer.pack(*args)  # type: ignore[arg-type]  # its stub: each argument a List
        return packed


class HiredisConnection(_HiredisPacking, aioredis.Connection):
    pass


class HiredisSSLConnection(_HiredisPacking, aioredis.SSLConnection):
    pass


class HiredisUnixConnection(_HiredisPacking, aioredis.UnixDomainSocketConnection):
    pass


_PACKED: dict[type[Any], type[Any]] = {
    aioredis.Connection: HiredisConnection,
    aioredis.SSLConnection: HiredisSSLConnection,
    aioredis.UnixDomainSocketConnection: HiredisUnixConnection,
}


def run_with_redis(url: str, prog: str, work: Callable[[aioredis.Redis], Awaitable[T]],
                   socket_timeout_s: float = 30.0) -> T | None:
    """For a command line: run `work` with a client for `url` it does not own (closed here); None after a
    one-line error on stderr, prefixed `prog`, when Redis is unreachable or failing or the URL is malformed."""

    async def run() -> T:
        client = redis_from_url(url, socket_connect_timeout=2.0, socket_timeout=socket_timeout_s)
        try:
            return await work(client)
        finally:
            await client.aclose()

    try:
        return asyncio.run(run())
    except REDIS_FAILURES as exc:
        print(f"{prog}: Redis at {safe_url(url)} unreachable or failing: {exc}", file=sys.stderr)
        return None
    except ValueError as exc:  # e.g. a malformed URL or an unexpected reply
        print(f"{prog}: {exc}", file=sys.stderr)
        return None


def safe_url(url: str) -> str:
    """The URL without a password."""
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        rest = "***@" + rest.split("@", 1)[1]
    return scheme + sep + rest


def redis_from_url(url: str, **options: Any) -> aioredis.Redis:
    """A client for `url` (see the module docstring); `options` go to redis-py's constructor (timeouts,
    retry). The caller owns it (`await client.aclose()`). No I/O: the first command connects.

    A cluster client is returned typed as `Redis`: redis-py types the two as unrelated classes, but
    `RedisCluster` has every command, `pipeline` and `register_script` the gateway calls, with the same
    signatures."""
    scheme, sep, rest = url.partition("://")
    if not is_cluster_url(url):
        client = aioredis.Redis.from_url(url, **options)
        pool = client.connection_pool  # the URL's scheme chose its connection class (TCP, TLS, Unix socket)
        if HIREDIS_AVAILABLE and pool.connection_class in _PACKED:  # swapped before any connection exists
            pool.connection_class = _PACKED[pool.connection_class]
        return client
    return cast(aioredis.Redis, RedisCluster.from_url(f"{CLUSTER_SCHEMES[scheme.lower()]}{sep}{rest}", **options))
