"""A pool of engine replicas with load-aware choice.

Load = the gateway's own in-flight count for the replica (exact, instant) plus what the engine itself
reports on `/metrics` (running + waiting requests, KV-cache use), scraped every `probe_interval_s` while something
reads it on the serving path (more than one replica to choose from, or `load_read()`: the ladder, the autoscaler,
speculative-decoding figures), else at every `IDLE_LOAD_PROBES`-th probe (vLLM's page is ~50 KB, rendered by its
API server).
A replica that refuses connections is marked down at once and probed back to life by the loop; one whose
health check times out is marked down only after `SLOW_PROBES_DOWN` timeouts in a row (a saturated engine
answers slowly but is still serving its batch: taking it out on one slow probe empties a busy pool). Each
replica also has a circuit breaker (`backends.clients.breaker`): `choose` skips replicas whose breaker is open
and sends a half-open replica only its one probe request; the proxy reports each outcome to it.

A probe that raises anything but the engine's own answers (a down or slow replica, a missing `/metrics`) is a probe
error, a bug or an engine saying what it should not: each replica's probe is isolated from the others', the
replica's state stays as the last good probe left it, `on_probe_error(pool, error type)` counts it, and it is logged
with its traceback at most once per `PROBE_ERROR_LOG_S` per pool (with the count since the last line).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from backends.background import stop
from backends.clients.breaker import BreakerConfig, BreakerState, CircuitBreaker, Clock
from backends.clients.connection import ConnectionSettings
from backends.clients.shared import EngineClient, EngineClients, EngineTimeout, EngineUnavailable

__all__ = ["BUSY_GRACE_S", "DEFAULT_WEIGHTS", "IDLE_LOAD_PROBES", "PROBE_ERROR_LOG_S", "SLOW_PROBES_DOWN",
           "ChoiceWeights", "EngineLoad", "Pool", "ProbeErrorHook", "Replica", "parse_vllm_metrics"]

SLOW_PROBES_DOWN = 3
"""Health checks in a row that must time out before a replica that still accepts connections is marked down."""
BUSY_GRACE_S = 10.0
"""A health check that times out does not count while the replica answered a real request this recently: a
saturated vLLM answers its health endpoint late, and taking a serving replica out only adds to the load."""
IDLE_LOAD_PROBES = 15
"""A replica's `/metrics` is scraped at one probe in this many while nothing on the serving path reads its load
(the gateway's own gauges of it then lag by up to 15 s at the default 1 s interval, a Prometheus scrape's)."""
PROBE_ERROR_LOG_S = 60.0
"""A pool's probe errors are logged at most once per this many seconds (each is counted)."""
ProbeErrorHook = Callable[[str, str], None]
"""``(pool, error type)``: a probe of one of the pool's replicas raised (see the module docstring)."""

log = logging.getLogger("cascade.pool")

_METRIC = re.compile(r"^(vllm:[a-z_]+)\{[^}]*\}\s+([0-9.eE+-]+|NaN)$", re.MULTILINE)


@dataclass(slots=True)
class EngineLoad:
    """What the engine said about itself at `at` (monotonic seconds)."""

    running: float = 0.0
    waiting: float = 0.0
    kv_cache_usage: float = 0.0  # fraction 0..1
    # speculative decoding: whether the engine reports it, and its counters since it started (tokens proposed,
    # tokens the model kept)
    speculative: bool = False
    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0
    at: float = 0.0

    @property
    def acceptance(self) -> float | None:
        """Share of proposed tokens the model kept since the engine started; None before any was proposed."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens > 0 else None


def parse_vllm_metrics(text: str) -> EngineLoad:
    """Sum vLLM's gauges and speculative-decoding counters over engines in a Prometheus exposition. One regex
    pass and a few string compares: it runs every probe interval for every replica."""
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
        elif name == "vllm:spec_decode_num_draft_tokens_total":
            load.draft_tokens += v
            load.speculative = True
        elif name == "vllm:spec_decode_num_accepted_tokens_total":
            load.accepted_tokens += v
    return load


@dataclass(frozen=True, slots=True)
class ChoiceWeights:
    """What each unit of a replica's load weighs when a new request picks its replica (policy `replica_choice`)."""

    in_flight: float = 1.0
    running: float = 0.5
    queue: float = 2.0
    kv_cache: float = 4.0


DEFAULT_WEIGHTS = ChoiceWeights()


@dataclass(slots=True)
class Replica:
    """One engine endpoint. `in_flight` is owned by the gateway (incremented around each request)."""

    url: str
    healthy: bool = False
    in_flight: int = 0
    load: EngineLoad = field(default_factory=EngineLoad)
    failures: int = 0
    slow_probes: int = 0  # health checks in a row that timed out
    unscraped: int = IDLE_LOAD_PROBES  # probes since its /metrics was last asked for
    breaker: CircuitBreaker = field(default_factory=CircuitBreaker)

    @property
    def available(self) -> bool:
        """Healthy at the last probe and its breaker lets a request through now."""
        return self.healthy and self.breaker.available()

    def cost(self, weights: ChoiceWeights = DEFAULT_WEIGHTS) -> float:
        """Lower is better. Our own in-flight count is exact; engine gauges lag by one scrape."""
        queued = max(self.load.waiting, 0.0)
        return (weights.in_flight * self.in_flight + weights.running * self.load.running + weights.queue * queued
                + weights.kv_cache * self.load.kv_cache_usage)


class Pool:
    """Replicas of one pool. Owns its probe task (`start` / `aclose`), not the HTTP client (which it tells
    how to connect to its replicas when the pool has connection settings)."""

    def __init__(
        self,
        name: str,
        urls: Iterable[str],
        client: EngineClient,
        probe_interval_s: float = 1.0,
        health_path: str = "/health",
        headers: Mapping[str, str] | None = None,
        breaker: BreakerConfig | None = None,
        clock: Clock = time.monotonic,
        connection: ConnectionSettings | None = None,
        version: str = "",
        weights: ChoiceWeights = DEFAULT_WEIGHTS,
        on_probe_error: ProbeErrorHook | None = None,
        load_read: Callable[[], bool] | None = None,
    ) -> None:
        """`version` names the engine version its replicas run (a label for metrics and logs; the gateway's
        `policies.pools.engine_version`). `headers` go with every request to this pool's replicas (e.g. a
        remote API key); `breaker` configures each replica's circuit breaker, `clock` is its time source
        (monotonic seconds); `weights` how `choose` weighs each replica's load (may be replaced while serving).
        `connection` (a remote pool's proxies, CA bundle, client certificate) is handed to `client`, which
        must then be the router of `backends.clients.shared` (`EngineClients`); a file it names that cannot
        be used raises `ConnectionSettingsError` here. `load_read()`: whether anything but the replica choice
        reads the engines' load now (asked at each probe; None: always)."""
        if connection is not None and not isinstance(client, EngineClients):
            raise TypeError(f"pool {name}: connection settings need an EngineClients, not {type(client).__name__}")
        self._connection = connection
        self.name = name
        self.version = version
        self.weights = weights
        self.headers: Mapping[str, str] = headers or {}
        self._breaker = breaker or BreakerConfig()
        self._clock = clock
        self._client = client
        self.replicas: list[Replica] = []
        self.set_urls(urls)
        self._interval = probe_interval_s
        self._health_path = health_path
        self._task: asyncio.Task[None] | None = None
        self._on_probe_error = on_probe_error
        self._load_read = load_read
        self._probe_errors = 0  # since the last line logged
        self._probe_logged_at = -math.inf

    def set_urls(self, urls: Iterable[str], ready: bool = False) -> None:
        """Replace the replica set, keeping the state of replicas that stay. `ready`: the caller has just seen
        the new replicas answer their health check (the supervisor that started them), so they take requests
        at once instead of after the next probe; a swap of replica sets then leaves no moment without one."""
        urls = [u.rstrip("/") for u in urls]
        self._configure(urls)
        known = {r.url: r for r in self.replicas}
        self.replicas = [known.get(u) or self._replica(u, ready) for u in urls]

    def _configure(self, urls: list[str]) -> None:
        """Tell the client how to reach `urls` (a pool with connection settings)."""
        if self._connection is not None and isinstance(self._client, EngineClients):
            self._client.configure(urls, self._connection)

    async def move_to(self, urls: Iterable[str]) -> None:
        """Replace the replica set with `urls` once the new replicas have been health-checked: those that stay
        keep their state, the new ones take requests at once if they answered, and until then the old set keeps
        serving (`set_urls` alone would leave the pool without an available replica until the next probe)."""
        urls = [u.rstrip("/") for u in urls]
        known = {r.url: r for r in self.replicas}
        fresh = {u: self._replica(u) for u in urls if u not in known}
        self._configure([*known, *fresh])
        await asyncio.gather(*(self._probe_alone(r) for r in fresh.values()))
        self._configure(urls)
        self.replicas = [known.get(u) or fresh[u] for u in urls]

    def _replica(self, url: str, ready: bool = False) -> Replica:
        return Replica(url=url.rstrip("/"), healthy=ready, breaker=CircuitBreaker(self._breaker, self._clock))

    def choose(self, exclude: frozenset[str] = frozenset()) -> Replica | None:
        """The available replica with the least load, or None. The caller now holds the replica's breaker
        (its half-open probe slot, if it was half-open) and must report the outcome to it."""
        candidates = [r for r in self.replicas if r.available and r.url not in exclude]
        weights = self.weights
        replica = min(candidates, key=lambda r: r.cost(weights), default=None)
        if replica is not None:
            replica.breaker.acquire()
        return replica

    @property
    def in_flight(self) -> int:
        """Requests this gateway has open to the pool's replicas now."""
        return sum(r.in_flight for r in self.replicas)

    @property
    def ready(self) -> bool:
        """Some replica is healthy and its breaker is not open (a half-open one counts: it can be probed)."""
        return any(r.healthy and r.breaker.state is not BreakerState.OPEN for r in self.replicas)

    def mark_failed(self, replica: Replica, reason: str) -> None:
        if replica.healthy:
            log.warning("replica down", extra={"pool": self.name, "replica": replica.url, "reason": reason})
        replica.healthy = False
        replica.failures += 1

    async def probe_once(self) -> None:
        """Probe every replica, each on its own: one whose probe raises keeps its state (a probe error)."""
        await asyncio.gather(*(self._probe_alone(r) for r in self.replicas))

    async def _probe_alone(self, replica: Replica) -> None:
        try:
            await self._probe(replica)
        except Exception as exc:
            self._probe_failed(replica, exc)

    def _probe_failed(self, replica: Replica, exc: Exception) -> None:
        if self._on_probe_error is not None:
            self._on_probe_error(self.name, type(exc).__name__)
        self._probe_errors += 1
        now = self._clock()
        if now - self._probe_logged_at >= PROBE_ERROR_LOG_S:
            log.error("probing a replica failed: %s: %s", type(exc).__name__, exc, exc_info=exc, extra={
                "pool": self.name, "replica": replica.url, "probe_errors": self._probe_errors})
            self._probe_logged_at, self._probe_errors = now, 0

    async def _probe(self, replica: Replica) -> None:
        try:
            await self._client.get_text(replica.url + self._health_path, headers=self.headers or None)
        except EngineTimeout as exc:
            if replica.healthy and replica.breaker.answered_within(BUSY_GRACE_S):
                return  # busy, not down: it is answering traffic
            replica.slow_probes += 1
            if replica.healthy and replica.slow_probes >= SLOW_PROBES_DOWN:
                self.mark_failed(replica, f"{exc} ({replica.slow_probes} health checks in a row)")
            return
        except EngineUnavailable as exc:
            if replica.healthy:
                self.mark_failed(replica, str(exc))
            return
        replica.slow_probes = 0
        if not replica.healthy:
            log.info("replica ready", extra={"pool": self.name, "replica": replica.url})
        replica.healthy = True
        if not self._load_due(replica):
            replica.unscraped += 1
            return
        replica.unscraped = 0
        with contextlib.suppress(EngineUnavailable):
            replica.load = parse_vllm_metrics(await self._client.get_text(replica.url + "/metrics",
                                                                          headers=self.headers or None))

    def _load_due(self, replica: Replica) -> bool:
        """Scrape at every probe while something reads the load, else at one in `IDLE_LOAD_PROBES`."""
        if len(self.replicas) > 1 or self._load_read is None or self._load_read():
            return True
        return replica.unscraped + 1 >= IDLE_LOAD_PROBES

    async def _loop(self) -> None:
        while True:
            await self.probe_once()  # each replica's probe errors are its own (counted, logged)
            await asyncio.sleep(self._interval)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name=f"probe:{self.name}")

    async def aclose(self) -> None:
        await stop(self._task)
        self._task = None
