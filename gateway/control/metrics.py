"""Prometheus metrics of one gateway process, in a registry it owns (no module-level globals).

Per-request figures are observed from the finished `CostRecord` (tokens, micro-USD, TTFT, latency), so
what the metrics count and what the ledger records cannot drift apart. Per-replica gauges are read from
the pools at scrape time.

Several processes (`cascade serve --workers N`): the parent sets `PROMETHEUS_MULTIPROC_DIR` (prometheus_client's
multiprocess mode, see `multiprocess_dir`) before it spawns the workers. Every counter, histogram and gauge then
lives in memory-mapped files there, and `render()` in any worker answers the sum over all workers, dead ones
included for counters (totals never drop when a worker restarts); gauges declare how they combine
(`multiprocess_mode`). The per-replica gauges are read at scrape time from the answering worker's pools: health,
KV-cache use, queue depth and breaker state describe the shared engines, which every worker probes alike;
`cascade_replica_in_flight` is that worker's own in-flight count, not the sum.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from backends.breaker import BreakerState
from backends.pool import Pool
from gateway.ledger.store import CostRecord

__all__ = ["CONTENT_TYPE", "MULTIPROC_ENV", "GatewayMetrics", "multiprocess_dir", "prepare_multiprocess_dir",
           "worker_exited"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_FAST = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1)
_BREAKER_LEVEL = {BreakerState.CLOSED: 0.0, BreakerState.HALF_OPEN: 0.5, BreakerState.OPEN: 1.0}
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
"""prometheus_client reads it once, when it is imported: it must be in a worker's environment when it starts
(and in no other process's: a vLLM engine would write its own metrics there)."""


def multiprocess_dir() -> Path | None:
    """The folder of prometheus_client's multiprocess mode in this process (None: one process, in memory)."""
    value = os.environ.get(MULTIPROC_ENV)
    return Path(value) if value else None


def prepare_multiprocess_dir(path: Path) -> Path:
    """Empty `path` (what a previous run left there would be summed in) and return it. Called by the parent of
    the workers before it starts any; it then gives them `MULTIPROC_ENV=path`."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def worker_exited(pid: int, path: Path) -> None:
    """Drop the live gauges of a worker process that has exited (its counters stay in the sum)."""
    multiprocess.mark_process_dead(pid, str(path))  # type: ignore[no-untyped-call]


class _PoolCollector(Collector):
    def __init__(self, pools: Callable[[], Mapping[str, Pool]]) -> None:
        self._pools = pools

    def collect(self) -> Iterable[Metric]:
        in_flight = GaugeMetricFamily("cascade_replica_in_flight", "requests in flight per replica, as the gateway "
                                      "sees them", labels=["pool", "replica"])
        healthy = GaugeMetricFamily("cascade_replica_healthy", "1 if the replica passed its last probe",
                                    labels=["pool", "replica"])
        kv = GaugeMetricFamily("cascade_replica_kv_cache_usage", "engine KV-cache use (0..1), as scraped",
                               labels=["pool", "replica"])
        queue = GaugeMetricFamily("cascade_replica_queue_depth", "engine waiting requests, as scraped",
                                  labels=["pool", "replica"])
        breaker = GaugeMetricFamily("cascade_replica_breaker_open", "circuit breaker: 0 closed, 0.5 half-open "
                                    "(probing), 1 open", labels=["pool", "replica"])
        for name, pool in self._pools().items():
            for r in pool.replicas:
                labels = [name, r.url]
                in_flight.add_metric(labels, r.in_flight)
                healthy.add_metric(labels, 1.0 if r.healthy else 0.0)
                kv.add_metric(labels, r.load.kv_cache_usage)
                queue.add_metric(labels, r.load.waiting)
                breaker.add_metric(labels, _BREAKER_LEVEL[r.breaker.state])
        return [in_flight, healthy, kv, queue, breaker]


class GatewayMetrics:
    """All metrics of the gateway. `render()` is the `/metrics` body."""

    def __init__(self, pools: Callable[[], Mapping[str, Pool]]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("cascade_requests", "chat requests by outcome", ["pool", "rule", "status", "tenant"],
                                registry=r)
        self.tokens = Counter("cascade_tokens", "tokens recorded", ["pool", "kind"], registry=r)
        self.cost = Counter("cascade_cost_micro_usd", "cost recorded, micro-USD", ["pool", "tenant"], registry=r)
        self.savings = Counter("cascade_savings_micro_usd", "flagship-counterfactual cost minus cost, micro-USD",
                               ["tenant"], registry=r)
        self.ttft = Histogram("cascade_ttft_seconds", "time to first token (streams)", ["pool"],
                              buckets=_LATENCY, registry=r)
        self.itl = Histogram("cascade_inter_token_seconds", "gap between streamed content events", ["pool"],
                             buckets=_FAST, registry=r)
        self.latency = Histogram("cascade_request_seconds", "end-to-end request latency", ["pool"],
                                 buckets=_LATENCY, registry=r)
        self.overhead = Histogram("cascade_gateway_overhead_seconds", "time spent in the gateway before the "
                                  "upstream call (parse, auth, score, route)", buckets=_FAST, registry=r)
        self.budget = Counter("cascade_budget_events", "requests of tenants past their soft limit or budget",
                              ["tenant", "state"], registry=r)
        self.unchecked = Counter("cascade_admission_unchecked", "requests whose rate limits or budget could not be "
                                 "checked (Redis unreachable), by the tenant's on_redis_outage policy: fail_open "
                                 "admitted, fail_closed refused with 503", ["tenant", "check", "policy"], registry=r)
        self.store_unreachable = Gauge("cascade_admission_store_unreachable", "1 while the last rate-limit or "
                                       "budget check found Redis unreachable", ["check"], registry=r,
                                       multiprocess_mode="livemax")
        self.ladder = Gauge("cascade_degradation_active", "1 while a degradation ladder step is engaged", ["step"],
                            registry=r, multiprocess_mode="livemax")  # the ladder is one across workers
        self.scoring = Histogram("cascade_scoring_seconds", "complexity scoring latency", buckets=_FAST, registry=r)
        self.scoring_batch = Histogram("cascade_scoring_batch_size", "texts per classifier batch (micro-batcher)",
                                       buckets=(1, 2, 4, 8, 16, 32, 64), registry=r)
        self.feedback = Counter("cascade_feedback", "POST /v1/feedback by outcome: score, thumbs (stored), "
                                "not_found, invalid", ["outcome"], registry=r)
        self.learning = Counter("cascade_learning_events", "learning loop: prompts kept, shadow comparisons "
                                "judged or skipped (and why)", ["event"], registry=r)
        self.escalations = Counter("cascade_escalations", "cascade micro answers below min_confidence: escalated "
                                   "(pool: where to) or held (pool: micro, held_by: why the policy kept it)",
                                   ["outcome", "pool", "held_by"], registry=r)
        self.engine_restarts = Counter("cascade_engine_restarts", "local engine replicas restarted by the supervisor, "
                                       "by reason: exited (the process died) or hung (alive, but it answered no "
                                       "health check or request for the pool's hang_restart_after_s)",
                                       ["pool", "reason"], registry=r)
        r.register(_PoolCollector(pools))
        self._scrape_time = CollectorRegistry(auto_describe=True)  # multiprocess mode only: live, per worker
        self._scrape_time.register(_PoolCollector(pools))

    def register_scrape_time(self, collector: Collector) -> None:
        """Add a collector read at scrape time (from this process's state, in either mode)."""
        self.registry.register(collector)
        self._scrape_time.register(collector)

    def observe_record(self, rec: CostRecord) -> None:
        self.requests.labels(rec.pool, rec.rule, rec.status, rec.tenant).inc()
        self.tokens.labels(rec.pool, "prompt").inc(rec.prompt_tokens)
        self.tokens.labels(rec.pool, "completion").inc(rec.completion_tokens)
        self.cost.labels(rec.pool, rec.tenant).inc(rec.cost_micro_usd)
        self.savings.labels(rec.tenant).inc(max(0, rec.flagship_cost_micro_usd - rec.cost_micro_usd))
        if rec.ttft_ms is not None:
            self.ttft.labels(rec.pool).observe(rec.ttft_ms / 1000)
        self.latency.labels(rec.pool).observe(rec.latency_ms / 1000)

    def engine_restarted(self, pool: str, index: int, reason: str) -> None:
        """The supervisor restarted replica `index` of `pool` (`backends.supervisor.RestartHook`)."""
        self.engine_restarts.labels(pool, reason).inc()

    def ladder_changed(self, engaged: set[str], released: set[str]) -> None:
        for step in engaged:
            self.ladder.labels(step).set(1)
        for step in released:
            self.ladder.labels(step).set(0)

    def observe_rejected(self, status: int, tenant: str) -> None:
        """A request that never reached an engine (bad input, auth, no replica)."""
        self.requests.labels("none", "none", str(status), tenant).inc()

    def render(self) -> bytes:
        """The exposition text: this process's registry, or the sum of every worker's in multiprocess mode
        plus this worker's scrape-time collectors."""
        path = multiprocess_dir()
        if path is None:
            return generate_latest(self.registry)
        merged = CollectorRegistry()
        multiprocess.MultiProcessCollector(merged, str(path))  # type: ignore[no-untyped-call]
        return generate_latest(merged) + generate_latest(self._scrape_time)
