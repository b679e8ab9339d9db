"""How a pool set builds a `Pool` from a pool's spec: its replicas' URLs, health path, breaker, connection
settings, API key and version. No I/O but reading the engine registry and the environment."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from pathlib import Path

from backends.clients.breaker import BreakerConfig
from backends.clients.pool import ChoiceWeights, Pool, ProbeErrorHook
from backends.clients.shared import EngineClient
from backends.engines.registry import REGISTRY_ENV, published
from backends.engines.supervisor import Answered
from backends.machine_checks import connection_settings
from gateway.settings import Settings
from policies.pools import pool_version
from policies.schema import LocalPool, Policy, RemotePool

__all__ = ["ENGINE_LOAD_SIGNALS", "PoolBuilder", "api_key_headers", "choice_weights", "engine_load_read",
           "last_answer"]

log = logging.getLogger("cascade.pools")

ENGINE_LOAD_SIGNALS = frozenset({"kv_cache_usage", "queue_depth"})
"""The ladder's and the autoscaler's signals scraped from the engines' `/metrics` (the others are the gateway's)."""


class PoolBuilder:
    """Builds pools on the shared engine client (not owned). `registry`: where the process that runs the engines
    publishes their ports (set by the parent of `--workers N` in its workers' environment), None otherwise."""

    def __init__(self, settings: Settings, client: EngineClient) -> None:
        self._settings = settings
        self._client = client
        self.on_probe_error: ProbeErrorHook | None = None  # read at each error, so it may be set after a build
        # whether anything reads pool `name`'s engine load (`engine_load_read`); read at each probe (None: always)
        self.load_read: Callable[[str], bool] | None = None
        registry = os.environ.get(REGISTRY_ENV)
        self.registry = Path(registry) if registry and not settings.start_engines else None

    def static_urls(self, name: str, spec: LocalPool | RemotePool) -> list[str]:
        """A remote pool's URLs; a local pool's as published, else on its base ports (none while this process
        starts them: filled in once its supervisor has them up)."""
        if isinstance(spec, RemotePool):
            return list(spec.urls)
        if self._settings.start_engines:
            return []
        urls = None if self.registry is None else published(self.registry, name)
        if urls is not None:  # where the process running the engines says they listen
            return list(urls)
        return [f"http://127.0.0.1:{spec.engine.base_port + i}" for i in range(spec.engine.replicas)]

    def build(self, name: str, spec: LocalPool | RemotePool, urls: list[str] | None = None) -> Pool:
        """A `Pool` of `spec`'s replicas (`urls`: these instead), not started."""
        health = spec.health_path if isinstance(spec, RemotePool) else "/health"
        breaker = BreakerConfig(**spec.breaker.model_dump())
        connection = connection_settings(spec) if isinstance(spec, RemotePool) else None
        return Pool(name, self.static_urls(name, spec) if urls is None else urls, self._client,
                    probe_interval_s=self._settings.probe_interval_s, health_path=health,
                    headers=api_key_headers(name, spec), breaker=breaker, connection=connection,
                    version=pool_version(spec), weights=choice_weights(spec),
                    on_probe_error=self._probe_error, load_read=functools.partial(self._load_read, name))

    def _load_read(self, name: str) -> bool:
        return self.load_read is None or self.load_read(name)

    def _probe_error(self, pool: str, error: str) -> None:
        if self.on_probe_error is not None:
            self.on_probe_error(pool, error)


def engine_load_read(policy: Policy, name: str) -> bool:
    """Whether `policy` reads pool `name`'s engine load beyond the replica choice and the gateway's own gauges: a
    ladder step or the pool's autoscaler watching a scraped signal, or speculative decoding (its counters); a
    pool the policy does not name (being retired): yes."""
    spec = policy.pools.get(name)
    if spec is None or any(s.pool == name and s.signal in ENGINE_LOAD_SIGNALS for s in policy.degradation.steps):
        return True
    if isinstance(spec, RemotePool):
        return False
    scaled = spec.autoscale is not None and bool(ENGINE_LOAD_SIGNALS & set(spec.autoscale.scale_up.bounds()))
    return scaled or spec.engine.speculative is not None


def choice_weights(spec: LocalPool | RemotePool) -> ChoiceWeights:
    """The pool's `replica_choice` as the replica choice reads it."""
    return ChoiceWeights(**spec.replica_choice.model_dump())


def api_key_headers(name: str, spec: LocalPool | RemotePool) -> dict[str, str]:
    """A remote pool's API key, read from the environment variable the policy names (never stored)."""
    if isinstance(spec, LocalPool) or spec.api_key_env is None:
        return {}
    key = os.environ.get(spec.api_key_env)
    if not key:
        log.warning("pool %s: environment variable %s is not set; calling it without an API key",
                    name, spec.api_key_env)
        return {}
    return {"authorization": f"Bearer {key}"}


def last_answer(pool: Pool) -> Answered:
    """When the gateway last got an answer to a request from the replica at a URL (its breaker's record, in
    monotonic seconds), so that the supervisor does not take a busy engine that answers /health late for hung."""
    def answered(url: str) -> float | None:
        return next((r.breaker.last_success for r in pool.replicas if r.url == url.rstrip("/")), None)

    return answered
