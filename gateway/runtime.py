"""The composition root's parts: everything a running gateway owns, built and closed in one place."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import redis.asyncio as aioredis

from backends.engine_client import EngineClient, make_http_client
from backends.pool import Pool
from backends.supervisor import EngineSupervisor
from gateway.accounting import Accountant
from gateway.ledger import Ledger, MemoryLedger
from gateway.metrics import GatewayMetrics
from gateway.policy_holder import PolicyHolder
from gateway.proxy import Proxy
from gateway.service import ChatService
from gateway.settings import Settings
from policies.loader import load_policy
from policies.schema import LocalPool, Policy
from router_models.scorer import LengthScorer, Scorer

__all__ = ["EngineStarter", "Runtime", "build_runtime"]

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
    engines: EngineStarter
    metrics: GatewayMetrics

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
        await self.engines.aclose()
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


def _static_urls(name: str, policy: Policy, settings: Settings) -> list[str]:
    pool = policy.pools[name]
    if pool.type == "remote":
        return list(pool.urls)
    if settings.start_engines:
        return []  # filled in by the engine starter once the supervisor has them up
    return [f"http://127.0.0.1:{pool.engine.base_port + i}" for i in range(pool.engine.replicas)]


class EngineStarter:
    """Starts the local pools' engines in the background, so the gateway answers /healthz and /readyz
    (with progress) while engines load. Owns the supervisors and its task."""

    def __init__(self, settings: Settings, progress: Callable[[str], None] | None = None) -> None:
        self._settings = settings
        self._progress = progress
        self.supervisors: dict[str, EngineSupervisor] = {}
        self.status: dict[str, str] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self, policy: Policy, pools: dict[str, Pool]) -> None:
        local = {n: p for n, p in policy.pools.items() if isinstance(p, LocalPool)}
        if not self._settings.start_engines or not local:
            return
        self._task = asyncio.create_task(self._start_all(local, pools), name="engine-starter")

    async def _start_all(self, local: dict[str, LocalPool], pools: dict[str, Pool]) -> None:
        await asyncio.gather(*(self._start_one(n, p, pools[n]) for n, p in local.items()))

    async def _start_one(self, name: str, spec: LocalPool, pool: Pool) -> None:
        sup = EngineSupervisor(name, spec.engine, home=self._settings.home, progress=self._progress)
        self.supervisors[name] = sup
        self.status[name] = "starting"
        started = time.monotonic()
        try:
            await sup.start()
        except Exception as exc:
            self.status[name] = f"failed: {exc}"
            log.error("engines of pool %s failed to start: %s", name, exc)
            return
        pool.set_urls(sup.urls)
        await pool.probe_once()
        self.status[name] = f"ready after {time.monotonic() - started:.0f} s"

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for sup in self.supervisors.values():
            await sup.aclose()


async def _make_pools(policy: Policy, settings: Settings, client: EngineClient) -> dict[str, Pool]:
    interval = settings.probe_interval_s
    pools = {n: Pool(n, _static_urls(n, policy, settings), client, probe_interval_s=interval) for n in policy.pools}
    await asyncio.gather(*(pool.probe_once() for pool in pools.values()))
    for pool in pools.values():
        pool.start()
    return pools


async def build_runtime(settings: Settings, progress: Callable[[str], None] | None = None) -> Runtime:
    """Build everything; local engines start in the background when `settings.start_engines`
    (`Runtime.engines.status` tells how far they are). On failure, closes what it had built."""
    policies = PolicyHolder(load_policy(settings.policy_path))
    http = make_http_client(settings.transport)
    engines = EngineClient(http)
    try:
        ledger = await _make_ledger(settings)
    except BaseException:
        await http.aclose()
        raise
    try:
        scorer = await asyncio.to_thread(_make_scorer, settings)
        pools = await _make_pools(policies.current.policy, settings, engines)
    except BaseException:
        await ledger.aclose()
        await http.aclose()
        raise
    starter = EngineStarter(settings, progress)
    starter.start(policies.current.policy, pools)
    metrics = GatewayMetrics(lambda: pools)
    accountant = Accountant(ledger, metrics)
    service = ChatService(policies, pools, scorer, Proxy(engines), engines, accountant, metrics)
    redis = aioredis.from_url(settings.redis_url) if settings.ledger == "redis" else None
    return Runtime(settings, policies, http, pools, scorer, ledger, accountant, service, redis, starter, metrics)
