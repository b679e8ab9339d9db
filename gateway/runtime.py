"""The composition root's parts: everything a running gateway owns, built and closed in one place."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import redis.asyncio as aioredis

from backends.engine_client import EngineClient, make_http_client
from backends.pool import Pool
from backends.supervisor import EngineSupervisor
from gateway.accounting import Accountant
from gateway.ledger import Ledger, MemoryLedger
from gateway.policy_holder import PolicyHolder
from gateway.proxy import Proxy
from gateway.service import ChatService
from gateway.settings import Settings
from policies.loader import load_policy
from policies.schema import LocalPool, Policy
from router_models.scorer import LengthScorer, Scorer

__all__ = ["Runtime", "build_runtime"]

log = logging.getLogger("cascade.runtime")


@dataclass
class Runtime:
    """Owns: the HTTP client, pools, supervisors, scorer, ledger and Redis client. `aclose` frees all."""

    settings: Settings
    policies: PolicyHolder
    http: httpx.AsyncClient
    pools: dict[str, Pool]
    scorer: Scorer | None
    ledger: Ledger
    accountant: Accountant
    service: ChatService
    redis: aioredis.Redis | None
    supervisors: list[EngineSupervisor] = field(default_factory=list)

    async def redis_ok(self) -> bool:
        if self.redis is None:
            return True
        try:
            return bool(await asyncio.wait_for(self.redis.ping(), 1.0))
        except Exception:
            return False

    async def aclose(self) -> None:
        await self.accountant.drain()
        for pool in self.pools.values():
            await pool.aclose()
        for sup in self.supervisors:
            await sup.aclose()
        if self.scorer is not None:
            await self.scorer.aclose()
        await self.ledger.aclose()
        if self.redis is not None:
            await self.redis.aclose()
        await self.http.aclose()


def _make_scorer(settings: Settings) -> Scorer | None:
    if settings.scorer == "none":
        return None
    if settings.scorer == "length":
        return LengthScorer()
    from router_models.serving import load_scorer  # loads the embedding model: seconds

    return load_scorer()


async def _make_ledger(settings: Settings) -> Ledger:
    if settings.ledger == "memory":
        return MemoryLedger()
    from gateway.ledger import RedisLedger

    ledger = RedisLedger(settings.redis_url, settings.outbox_dir, key_prefix=settings.redis_prefix)
    await ledger.start()
    return ledger


async def _local_urls(
    name: str, pool: LocalPool, settings: Settings, supervisors: list[EngineSupervisor],
    progress: Callable[[str], None] | None,
) -> list[str]:
    if not settings.start_engines:
        return [f"http://127.0.0.1:{pool.engine.base_port + i}" for i in range(pool.engine.replicas)]
    sup = EngineSupervisor(name, pool.engine, home=settings.home, progress=progress)
    supervisors.append(sup)
    await sup.start()
    return list(sup.urls)


async def _make_pools(
    policy: Policy, settings: Settings, client: EngineClient, supervisors: list[EngineSupervisor],
    progress: Callable[[str], None] | None,
) -> dict[str, Pool]:
    names = list(policy.pools)
    urls = await asyncio.gather(*(
        _local_urls(n, p, settings, supervisors, progress) if p.type == "local" else _remote(p.urls)
        for n, p in policy.pools.items()
    ))
    interval = settings.probe_interval_s
    pools = {n: Pool(n, u, client, probe_interval_s=interval) for n, u in zip(names, urls, strict=True)}
    for pool in pools.values():
        await pool.probe_once()
        pool.start()
    return pools


async def _remote(urls: tuple[str, ...]) -> list[str]:
    return list(urls)


async def build_runtime(settings: Settings, progress: Callable[[str], None] | None = None) -> Runtime:
    """Build everything, starting local engines when `settings.start_engines`. On failure, closes
    what it had started and re-raises."""
    policies = PolicyHolder(load_policy(settings.policy_path))
    http = make_http_client(settings.transport)
    engines = EngineClient(http)
    supervisors: list[EngineSupervisor] = []
    try:
        ledger = await _make_ledger(settings)
        scorer = await asyncio.to_thread(_make_scorer, settings)
        pools = await _make_pools(policies.current.policy, settings, engines, supervisors, progress)
    except BaseException:
        for sup in supervisors:
            with contextlib.suppress(Exception):
                await sup.aclose()
        await http.aclose()
        raise
    accountant = Accountant(ledger)
    service = ChatService(policies, pools, scorer, Proxy(engines), engines, accountant)
    redis = aioredis.from_url(settings.redis_url) if settings.ledger == "redis" else None
    return Runtime(settings, policies, http, pools, scorer, ledger, accountant, service, redis, supervisors)
