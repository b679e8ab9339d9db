"""The gateway's Redis client, for one server or a Redis Cluster, chosen by the URL.

`redis://host:port/db` (also `rediss://`, `unix://`) is one server: `redis.asyncio.Redis`.
`redis+cluster://host:port` (TLS: `rediss+cluster://`) is a Redis Cluster: `redis.asyncio.cluster.RedisCluster`,
which learns the slot map from that node (any one of the cluster's nodes will do), sends each command to the
master of its key's slot and follows MOVED/ASK when slots move. A cluster has only database 0.

On a cluster every multi-key command or script must keep its keys in one slot (hash tags). Which of the
gateway's Redis users do is listed in docs/ledger.md ("Redis Cluster").

`REDIS_FAILURES` is what a Redis user catches to treat Redis as unreachable: redis-py's cluster client raises
`RedisClusterException`, which is not a `RedisError`, when no node of the cluster answers.
"""

from __future__ import annotations

from typing import Any, cast

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisClusterException, RedisError

__all__ = ["CLUSTER_SCHEMES", "REDIS_FAILURES", "is_cluster_url", "redis_from_url"]

REDIS_FAILURES: tuple[type[Exception], ...] = (RedisError, RedisClusterException, OSError)

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}  # cluster scheme -> redis-py's scheme


def is_cluster_url(url: str) -> bool:
    """Whether `url` names a Redis Cluster (`redis+cluster://` or `rediss+cluster://`)."""
    return url.split("://", 1)[0].lower() in CLUSTER_SCHEMES


def redis_from_url(url: str, **options: Any) -> aioredis.Redis:
    """A client for `url` (see the module docstring); `options` go to redis-py's constructor (timeouts,
    retry). The caller owns it (`await client.aclose()`). No I/O: the first command connects.

    A cluster client is returned typed as `Redis`: redis-py types the two as unrelated classes, but
    `RedisCluster` has every command, `pipeline` and `register_script` the gateway calls, with the same
    signatures."""
    scheme, sep, rest = url.partition("://")
    if not is_cluster_url(url):
        return aioredis.Redis.from_url(url, **options)
    return cast(aioredis.Redis, RedisCluster.from_url(f"{CLUSTER_SCHEMES[scheme.lower()]}{sep}{rest}", **options))
