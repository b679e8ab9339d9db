"""A pool of engine replicas with load-aware choice.

Load = the gateway's own in-flight count for the replica (exact, instant) plus what the engine itself
reports on `/metrics` (running + waiting requests, KV-cache use), scraped every `probe_interval_s`.
A replica that refuses connections is marked down at once and probed back to life by the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from backends.engine_client import EngineClient, EngineUnavailable

__all__ = ["EngineLoad", "Pool", "Replica", "parse_vllm_metrics"]

log = logging.getLogger("cascade.pool")

_METRIC = re.compile(r"^(vllm:[a-z_]+)\{[^}]*\}\s+([0-9.eE+-]+|NaN)$", re.MULTILINE)


@dataclass(slots=True)
class EngineLoad:
    """What the engine said about itself at `at` (monotonic seconds)."""

    running: float = 0.0
    waiting: float = 0.0
    kv_cache_usage: float = 0.0  # fraction 0..1
    at: float = 0.0


def parse_vllm_metrics(text: str) -> EngineLoad:
    """Sum vLLM's gauges over engines in a Prometheus exposition."""
    load = EngineLoad(at=time.monotonic())
    for name, value in _METRIC.findall(text):
        v = float(value)
        if v != v:  # NaN
            continue
        if name == "vllm:num_requests_running":
            load.running += v
        elif name == "vllm:num_requests_waiting":
            load.waiting += v
        elif name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"):
            load.kv_cache_usage = max(load.kv_cache_usage, v)
    return load


@dataclass(slots=True)
class Replica:
    """One engine endpoint. `in_flight` is owned by the gateway (incremented around each request)."""

    url: str
    healthy: bool = False
    in_flight: int = 0
    load: EngineLoad = field(default_factory=EngineLoad)
    failures: int = 0

    def cost(self) -> float:
        """Lower is better. Our own in-flight count is exact; engine gauges lag by one scrape."""
        queued = max(self.load.waiting, 0.0)
        return self.in_flight + 0.5 * self.load.running + 2.0 * queued + 4.0 * self.load.kv_cache_usage


class Pool:
    """Replicas of one pool. Owns its probe task (`start` / `aclose`), not the HTTP client."""

    def __init__(
        self,
        name: str,
        urls: Iterable[str],
        client: EngineClient,
        probe_interval_s: float = 1.0,
        health_path: str = "/health",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """`headers` go with every request to this pool's replicas (e.g. a remote API key)."""
        self.name = name
        self.headers: Mapping[str, str] = headers or {}
        self.replicas = [Replica(url=u.rstrip("/")) for u in urls]
        self._client = client
        self._interval = probe_interval_s
        self._health_path = health_path
        self._task: asyncio.Task[None] | None = None

    def set_urls(self, urls: Iterable[str]) -> None:
        """Replace the replica set, keeping the state of replicas that stay."""
        known = {r.url: r for r in self.replicas}
        self.replicas = [known.get(u.rstrip("/"), Replica(url=u.rstrip("/"))) for u in urls]

    def choose(self, exclude: frozenset[str] = frozenset()) -> Replica | None:
        """The healthy replica with the least load, or None when none is available."""
        candidates = [r for r in self.replicas if r.healthy and r.url not in exclude]
        return min(candidates, key=Replica.cost, default=None)

    @property
    def ready(self) -> bool:
        return any(r.healthy for r in self.replicas)

    def mark_failed(self, replica: Replica, reason: str) -> None:
        if replica.healthy:
            log.warning("replica down", extra={"pool": self.name, "replica": replica.url, "reason": reason})
        replica.healthy = False
        replica.failures += 1

    async def probe_once(self) -> None:
        await asyncio.gather(*(self._probe(r) for r in self.replicas))

    async def _probe(self, replica: Replica) -> None:
        try:
            await self._client.get_text(replica.url + self._health_path)
        except EngineUnavailable as exc:
            if replica.healthy:
                self.mark_failed(replica, str(exc))
            return
        if not replica.healthy:
            log.info("replica ready", extra={"pool": self.name, "replica": replica.url})
        replica.healthy = True
        with contextlib.suppress(EngineUnavailable):
            replica.load = parse_vllm_metrics(await self._client.get_text(replica.url + "/metrics"))

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(Exception):
                await self.probe_once()
            await asyncio.sleep(self._interval)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name=f"probe:{self.name}")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
