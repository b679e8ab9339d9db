"""Prometheus metrics of one gateway process, in a registry it owns (no module-level globals).

Per-request figures are observed from the finished `CostRecord` (tokens, micro-USD, TTFT, latency), so
what the metrics count and what the ledger records cannot drift apart. Per-replica gauges are read from
the pools at scrape time.

Several processes (`cascade serve --workers N`): the parent sets `PROMETHEUS_MULTIPROC_DIR` (prometheus_client's
multiprocess mode, `gateway.telemetry.metrics_dir`) before it spawns the workers. Every counter, histogram and gauge
lives in memory-mapped files there, and `render()` in any worker answers the sum over all workers, dead ones
included for counters (totals never drop when a worker restarts). Counters and histograms are summed. Each gauge
is true on every scrape, whichever worker answers, in one of four ways:
- Summed over the live workers (`livesum`), each worker writing its own share:
  `cascade_replica_in_flight` (each worker writes its count of a replica whenever it changes, `in_flight_changed`,
  called by the proxy, and refreshes all of its replicas before it renders: the requests the whole host has open
  to each replica) and `cascade_ledger_outbox_records` (the records waiting in this worker's outbox on disk,
  written every second and before it renders). A worker that exits drops out of the sum (`metrics_dir.worker_exited`).
- The highest over the live workers (`livemax`), for a state that is one across workers:
  `cascade_degradation_active{step}` (one ladder leader decides for all, `gateway.control.adaptation.ladder_sync`; the
  others follow it) and `cascade_admission_store_unreachable{check}` (1 while any worker finds Redis unreachable).
- One series per worker, labelled `worker` (`gateway.telemetry.worker_gauges`), for a view each worker holds
  alone: `cascade_replica_healthy` and `cascade_replica_breaker_open` (what this worker's probes and requests saw,
  and so whether it routes to the replica), and the routing gauges of `gateway.control.adaptation.live_threshold`
  (`cascade_routing_threshold`, `_flagship_share_target`, `_flagship_share`, `_window_scores`: each worker
  routes with the value its own refresh of the shared window computed, up to a second apart). Dashboards take
  `min` / `max` by (pool, replica) or `max` over the workers. With one process there is no `worker` label.
- Read at scrape time from the answering worker, for what every worker reads alike from one source:
  `cascade_replica_kv_cache_usage` and `_queue_depth` (the engine's own figures, scraped by every worker from the
  same `/metrics` of the engine each probe, or each 15th where nothing routes by it: `backends.clients.pool`),
  `cascade_pool_replicas` (the pool's replicas, from the one policy and engine registry) and the speculative
  decoding figures (`gateway.telemetry.speculation_metrics`, engine counters scraped alike).
`cascade_engine_restarts_total{pool,reason}` and `cascade_scale_events_total{pool,direction,outcome}` are counted
once, by the process that supervises the engines: under `--workers N` the parent, in a file of the folder that every
worker's `render()` adds (`gateway.telemetry.parent_counters`). Router retraining is counted by the one process that
ran it (`gateway.learning.retrain`): `cascade_router_retrain_runs_total{outcome}` is summed,
`_last_run_timestamp_seconds` the highest over all workers (`max`), `_last_apgr_delta` the last written.

`cascade_ledger_records_total{outcome}`: what the ledger did with each record (`lost`: the outbox failed too);
`cascade_limiter_decisions_total{tenant,decision}` the rate limiter's decisions; `cascade_route_steps_total{step,pool}`
each step of an answered request's route; faults absorbed in the background: `gateway.telemetry.background_faults`.

Latency histograms, and why they are apart:
- `cascade_ttft_seconds`: a stream's (or a JSON answer assembled from a stream's) time to its first content
  event. It is also what the ledger's `ttft_ms`, the degradation ladder's `ttft_p95_s` and the canary guard read.
- `cascade_first_byte_seconds`: a non-streamed answer's time to the engine's first response byte. An OpenAI
  server (vLLM included) sends a JSON answer's headers with its body once it is generated, so this is the time to
  the whole answer, and it is taken when the answer has arrived. Mixed into `cascade_ttft_seconds` it would put
  whole generations into a time-to-first-token p99, trip the ladder's TTFT step, and, through the ledger's
  `ttft_ms`, give the version report (`gateway.costs.versions`) an inter-token latency of about 0. So it is a
  histogram of its own, and a non-streamed record's `ttft_ms` stays None.
- `cascade_inter_token_seconds`: per streamed content event, measured per arrival of a network chunk
  (`gateway.serving.sending.streaming`: a chunk of k events after a gap g counts g/k k times).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from backends.background import stop
from backends.clients.breaker import BreakerState
from backends.clients.pool import Pool, Replica
from gateway.ledger.record import in_domain_counters
from gateway.ledger.store import CostRecord
from gateway.telemetry.background_faults import BackgroundFaults
from gateway.telemetry.gc_pauses import GcMetrics
from gateway.telemetry.metrics_dir import multiprocess_dir
from gateway.telemetry.parent_counters import RESTARTS, SCALE_EVENTS, ParentCountersCollector
from gateway.telemetry.record_series import RecordSeries
from gateway.telemetry.speculation_metrics import SpeculationCollector
from gateway.telemetry.worker_gauges import HEALTHY, WorkerGauges, WorkerGaugesCollector
from policies.decide import RouteStep

__all__ = ["CONTENT_TYPE", "GatewayMetrics"]

log = logging.getLogger("cascade.metrics")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_FAST = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1)
# TTFT and inter-token gaps in the steps their targets are read in (a sub-200 ms TTFT p99, a gap of a few ms):
# `histogram_quantile` interpolates inside one bucket, so a bucket from 1 s to 2.5 s could not tell 200 ms from 1 s
_TTFT = (*(i / 100 for i in range(1, 26)), 0.3, 0.4, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30, 60)
_ITL = (0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15,
        0.25, 0.5, 1, 2.5)
_BREAKER_LEVEL = {BreakerState.CLOSED: 0.0, BreakerState.HALF_OPEN: 0.5, BreakerState.OPEN: 1.0}


class _EngineCollector(Collector):
    """Per-replica gauges every worker reads alike (the engine's figures) and, in one process, the in-flight
    counts."""

    def __init__(self, pools: Callable[[], Mapping[str, Pool]], in_flight: bool = True) -> None:
        """`in_flight=False`: leave `cascade_replica_in_flight` to the multiprocess gauge."""
        self._pools = pools
        self._in_flight = in_flight

    def collect(self) -> Iterable[Metric]:
        in_flight = GaugeMetricFamily("cascade_replica_in_flight", "requests in flight per replica, as the gateway "
                                      "sees them", labels=["pool", "replica"])
        kv = GaugeMetricFamily("cascade_replica_kv_cache_usage", "engine KV-cache use (0..1), as scraped",
                               labels=["pool", "replica"])
        queue = GaugeMetricFamily("cascade_replica_queue_depth", "engine waiting requests, as scraped",
                                  labels=["pool", "replica"])
        replicas = GaugeMetricFamily("cascade_pool_replicas", "replicas the pool routes to (autoscaled pools change "
                                     "it)", labels=["pool"])
        for name, pool in self._pools().items():
            replicas.add_metric([name], len(pool.replicas))
            for r in pool.replicas:
                labels = [name, r.url]
                in_flight.add_metric(labels, r.in_flight)
                kv.add_metric(labels, r.load.kv_cache_usage)
                queue.add_metric(labels, r.load.waiting)
        shared = [kv, queue, replicas]
        return [in_flight, *shared] if self._in_flight else shared


class _ViewCollector(Collector):
    """Per-replica gauges of this process's own view: health as its probes saw it, its circuit breaker."""

    def __init__(self, pools: Callable[[], Mapping[str, Pool]]) -> None:
        self._pools = pools

    def collect(self) -> Iterable[Metric]:
        healthy = GaugeMetricFamily(HEALTHY, "1 if the replica passed its last probe",
                                    labels=["pool", "replica"])
        breaker = GaugeMetricFamily("cascade_replica_breaker_open", "circuit breaker: 0 closed, 0.5 half-open "
                                    "(probing), 1 open", labels=["pool", "replica"])
        for name, pool in self._pools().items():
            for r in pool.replicas:
                healthy.add_metric([name, r.url], 1.0 if r.healthy else 0.0)
                breaker.add_metric([name, r.url], _BREAKER_LEVEL[r.breaker.state])
        return [healthy, breaker]


class GatewayMetrics:
    """All metrics of the gateway. `render()` is the `/metrics` body."""

    def __init__(self, pools: Callable[[], Mapping[str, Pool]]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("cascade_requests", "chat requests by outcome; version: the engine version that "
                                "answered (the pool's or its canary's, policies.pools.engine_version)",
                                ["pool", "rule", "status", "tenant", "version"], registry=r)
        self.tokens = Counter("cascade_tokens", "tokens recorded", ["pool", "kind"], registry=r)
        self.endpoint_requests = Counter("cascade_endpoint_requests", "recorded requests by OpenAI endpoint (chat, "
                                         "responses, completions, embeddings), pool and outcome",
                                         ["endpoint", "pool", "status"], registry=r)
        self.endpoint_cost = Counter("cascade_endpoint_cost_micro_usd", "cost recorded by OpenAI endpoint, micro-USD",
                                     ["endpoint", "pool"], registry=r)
        self.cost = Counter("cascade_cost_micro_usd", "cost recorded, micro-USD", ["pool", "tenant"], registry=r)
        self.savings = Counter("cascade_savings_micro_usd", "flagship-counterfactual cost minus cost, micro-USD",
                               ["tenant"], registry=r)
        self.ttft = Histogram("cascade_ttft_seconds", "time to first token (streams)", ["pool", "version"],
                              buckets=_TTFT, registry=r)
        self.first_byte = Histogram("cascade_first_byte_seconds", "non-streamed answers: time to the engine's "
                                    "first byte, which for a JSON answer comes with the whole answer",
                                    ["pool", "version"], buckets=_TTFT, registry=r)
        self.itl = Histogram("cascade_inter_token_seconds", "gap per streamed content event: a network chunk's gap "
                             "since the last, shared by the content events it carries", ["pool", "version"],
                             buckets=_ITL, registry=r)
        self.latency = Histogram("cascade_request_seconds", "end-to-end request latency", ["pool", "version"],
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
        self.loop_lag = Histogram("cascade_event_loop_lag_seconds", "how much later than asked the event loop ran a "
                                  "timer (gateway.telemetry.loop_lag): what holds every request in flight",
                                  buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1), registry=r)
        self.gc, self.faults = GcMetrics(r), BackgroundFaults(r)
        self.trace_export_failures = Counter("cascade_trace_export_failures", "batches of spans the OTLP receiver "
                                             "did not take (down, slow, refused): dropped", registry=r)
        self.scoring = Histogram("cascade_scoring_seconds", "complexity scoring latency", buckets=_FAST, registry=r)
        self.in_domain = Histogram("cascade_router_in_domain", "each scored request's in-domain figure: how close "
                                   "it is to the router's training data (0 unlike it, 1 like it)", ["tenant"],
                                   buckets=tuple(k / 10 for k in range(1, 11)), registry=r)
        self.scoring_batch = Histogram("cascade_scoring_batch_size", "texts per classifier batch (micro-batcher)",
                                       buckets=(1, 2, 4, 8, 16, 32, 64), registry=r)
        self.memory_moves = Counter("cascade_label_memory_moves", "scores moved by a label memory, by where: inline "
                                    "(on the event loop, memories up to 5,000 labels) or batched (a worker thread)",
                                    ["path"], registry=r)
        self.memory_batch = Histogram("cascade_label_memory_batch_size", "moves per worker-thread batch of label "
                                      "memory moves", buckets=(1, 2, 4, 8, 16, 32, 64), registry=r)
        self._router_scored = Counter("cascade_router_scored", "texts scored by the classifier, by model: "
                                           "primary, or overflow (a surge the primary could not score within "
                                           "overflow_after_ms)", ["model"], registry=r)
        self.feedback = Counter("cascade_feedback", "POST /v1/feedback by outcome: score, thumbs (stored), "
                                "not_found, invalid", ["outcome"], registry=r)
        self.learning = Counter("cascade_learning_events", "learning loop: prompts kept, shadow comparisons "
                                "judged or skipped (and why)", ["event"], registry=r)
        self.escalations = Counter("cascade_escalations", "cascade micro answers below min_confidence: escalated "
                                   "(pool: where to) or held (pool: micro, held_by: why the policy kept it)",
                                   ["outcome", "pool", "held_by"], registry=r)
        self.engine_restarts = Counter(RESTARTS[0], RESTARTS[1], list(RESTARTS[2]), registry=r)
        self.ledger_records = Counter("cascade_ledger_records", "cost records by what the ledger did with them: "
                                      "recorded, replayed (from the outbox), duplicates (already counted), spilled "
                                      "(to the outbox, Redis unreachable), lost (the outbox failed too)",
                                      ["outcome"], registry=r)
        self.limiter_decisions = Counter("cascade_limiter_decisions", "rate-limit decisions: admitted, limited "
                                         "(429), unchecked (Redis unreachable; the tenant's on_redis_outage "
                                         "decides)", ["tenant", "decision"], registry=r)
        self.guard_decisions = Counter("cascade_guard_decisions", "input guards' decisions (gateway.guards) per "
                                       "request: guard pii, size or language; action passed, redacted, refused or "
                                       "error (the guard failed; the request is served without it); kind: the PII "
                                       "kind found, the size bound passed, the language detected, or none",
                                       ["tenant", "guard", "kind", "action"], registry=r)
        self.route_steps = Counter("cascade_route_steps", "steps that chose or changed an answered request's pool "
                                   "(policies.decide.RouteStep: score, rule:<name>, context-fit, failover, ...), by "
                                   "the pool after the step", ["step", "pool"], registry=r)
        self.scale_events = Counter(SCALE_EVENTS[0], SCALE_EVENTS[1], list(SCALE_EVENTS[2]), registry=r)
        self.output_checks = Counter("cascade_output_checks", "output checks of answers (policies.output_checks): "
                                     "result pass, fail or error (the check itself failed; the answer is served)",
                                     ["pool", "model", "check", "result"], registry=r)
        self.output_actions = Counter("cascade_output_check_actions", "answers that failed an output check, by what "
                                      "the gateway did: escalated, retried, flagged, held (escalate or retry asked "
                                      "for, not possible: the answer is served flagged)",
                                      ["pool", "check", "action"], registry=r)
        self.cache_lookups = Counter("cascade_cache_lookups", "response cache (gateway.caching) by tenant, mode and "
                                     "result: hit (served from the cache), miss (an engine answered) or bypass "
                                     "(not eligible, or the cache unavailable)", ["tenant", "mode", "result"],
                                     registry=r)
        self.cache_failures = Counter("cascade_cache_failures", "response cache trouble, never a failed request: "
                                      "unavailable (Redis down or slow: bypassed), corrupt_entry (dropped, served "
                                      "fresh), no_embedding (semantic: the router kept no vector)",
                                      ["tenant", "mode", "reason"], registry=r)
        self.cache_avoided = Counter("cascade_cache_avoided_micro_usd", "what cache hits would have cost on their "
                                     "pool, micro-USD", ["tenant", "pool"], registry=r)
        self.retrain_runs = Counter("cascade_router_retrain_runs", "router retraining looks (policy learning.retrain, "
                                    "gateway.learning.retrain) by outcome: promoted, not_better (trained, not "
                                    "better on the held-back labels), skipped (too few new labels), failed",
                                    ["outcome"], registry=r)
        self.retrain_last = Gauge("cascade_router_retrain_last_run_timestamp_seconds", "UTC epoch seconds of the "
                                  "last retraining look, whatever its outcome", registry=r, multiprocess_mode="max")
        self.retrain_delta = Gauge("cascade_router_retrain_last_apgr_delta", "the last trained candidate's APGR "
                                   "minus the current artifact's, on the held-back labels", registry=r,
                                   multiprocess_mode="mostrecent")
        self.outbox = Gauge("cascade_ledger_outbox_records", "cost records waiting in the ledger's outbox on disk "
                            "(Redis was unreachable), to be replayed; summed over the workers", registry=r,
                            multiprocess_mode="livesum")
        self._record_series = RecordSeries(self)  # what `observe_record` moves, per label combination
        self._ledger_outcomes: dict[str, Counter] = {}
        self.outbox_records: Callable[[], int] | None = None
        """The records in this process's outbox now (the Redis ledger's `outbox_records`; None: no outbox)."""
        self._pools = pools
        path = multiprocess_dir()
        shared = path is not None
        self._in_flight = Gauge("cascade_replica_in_flight", "requests in flight per replica, as the gateway sees "
                                "them (summed over the live workers)", ["pool", "replica"], registry=None,
                                multiprocess_mode="livesum") if shared else None  # registry=None: in the files only
        r.register(_EngineCollector(pools, in_flight=not shared))
        r.register(SpeculationCollector(pools))
        self._scrape_time = CollectorRegistry(auto_describe=True)  # multiprocess mode only: live, per worker
        self._scrape_time.register(_EngineCollector(pools, in_flight=not shared))
        self._scrape_time.register(SpeculationCollector(pools))
        self._views: list[Collector] = []
        self._worker_gauges = WorkerGauges(path, self._views) if path is not None else None
        self._task: asyncio.Task[None] | None = None
        self.register_scrape_time(_ViewCollector(pools), own_view=True)

    def register_scrape_time(self, collector: Collector, own_view: bool = False) -> None:
        """Add a collector of gauges read at scrape time from this process's state. `own_view`: a state each
        worker holds for itself, published with a `worker` label under `--workers` (see the module docstring);
        else one every worker reads alike, read from the answering worker."""
        self.registry.register(collector)
        if own_view:
            self._views.append(collector)
        else:
            self._scrape_time.register(collector)

    def start(self, interval_s: float = 1.0) -> None:
        """Under `--workers`: `publish` every `interval_s` (an owned task, stopped by `aclose`), so that another
        worker's scrape reads this one's figures. With one process `render` publishes: nothing to start."""
        if self._worker_gauges is not None:
            self._task = asyncio.create_task(self._publish_every(interval_s), name="metrics-publish")

    async def _publish_every(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                self.publish()
            except Exception:  # a full disk must not stop the worker: the last figures stay
                log.exception("publishing this worker's gauges failed")

    async def aclose(self) -> None:
        """Stop publishing; under `--workers` this worker's own view leaves the exposition with it."""
        await stop(self._task)
        self._task = None
        if self._worker_gauges is not None:
            self._worker_gauges.remove()

    def observe_record(self, rec: CostRecord) -> None:
        s = self._record_series.series(rec)
        s.requests.inc()
        s.endpoint_requests.inc()
        s.endpoint_cost.inc(rec.cost_micro_usd)
        s.prompt_tokens.inc(rec.prompt_tokens)
        s.completion_tokens.inc(rec.completion_tokens)
        s.cost.inc(rec.cost_micro_usd)
        s.savings.inc(max(0, rec.flagship_cost_micro_usd - rec.cost_micro_usd))
        if rec.cache_avoided_micro_usd:
            self.cache_avoided.labels(rec.tenant, rec.pool).inc(rec.cache_avoided_micro_usd)
        if rec.ttft_ms is not None:
            self.ttft.labels(rec.pool, rec.pool_version or "none").observe(rec.ttft_ms / 1000)
        s.latency.observe(rec.latency_ms / 1000)
        if in_domain_counters(rec)[0]:  # once per request (not a cascade probe, not a discarded answer)
            self.in_domain.labels(rec.tenant).observe(float(rec.in_domain or 0.0))

    def memory_batch_moved(self, size: int) -> None:
        """A worker thread moved `size` scores in one batch (`LabelMemories.on_batch`)."""
        self.memory_moves.labels("batched").inc(size)
        self.memory_batch.observe(size)

    def engine_restarted(self, pool: str, index: int, reason: str) -> None:
        """The supervisor restarted replica `index` of `pool` (`backends.engines.supervisor.RestartHook`)."""
        self.engine_restarts.labels(pool, reason).inc()

    def ledger_event(self, outcome: str) -> None:
        """The ledger recorded, replayed, saw again, spilled or lost a record (`LedgerCounts.on_event`)."""
        child = self._ledger_outcomes.get(outcome)  # five names: looked up once each, not per record
        if child is None:
            child = self._ledger_outcomes[outcome] = self.ledger_records.labels(outcome)
        child.inc()

    def guard_decision(self, tenant: str, guard: str, kind: str, action: str) -> None:
        """An input guard decided on a request (`gateway.guards.screen.DecisionHook`)."""
        self.guard_decisions.labels(tenant, guard, kind, action).inc()

    def route_taken(self, route: Iterable[RouteStep]) -> None:
        """An answered request's route (`RouteDecision.route`): each step counted once."""
        for step in route:
            self.route_steps.labels(step.step, step.pool).inc()

    def scale_event(self, pool: str, direction: str, outcome: str) -> None:
        """The autoscaler changed, or tried to change, `pool`'s replicas (`gateway.control.fleet.autoscale`)."""
        self.scale_events.labels(pool, direction, outcome).inc()

    def retrain_finished(self, outcome: str, at: float, apgr_delta: float | None) -> None:
        """A retraining look ended (`gateway.learning.retrain.RetrainSchedule`) at `at` (UTC epoch seconds)."""
        self.retrain_runs.labels(outcome).inc()
        self.retrain_last.set(at)
        if apgr_delta is not None:
            self.retrain_delta.set(apgr_delta)

    def router_scored(self, model: str, texts: int) -> None:
        """The classifier scored `texts` texts with `model`: "primary" or "overflow" (`ClassifierScorer.on_scored`)."""
        self._router_scored.labels(model).inc(texts)

    def in_flight_changed(self, pool: str, replica: Replica) -> None:
        """`replica.in_flight` of `pool` has just changed (`gateway.serving.sending.proxy.InFlightHook`). Multiprocess
        mode writes it to this worker's live gauge file; with one process the scrape reads the pools instead."""
        if self._in_flight is not None:
            self._in_flight.labels(pool, replica.url).set(replica.in_flight)

    def ladder_changed(self, engaged: set[str], released: set[str]) -> None:
        for step in engaged:
            self.ladder.labels(step).set(1)
        for step in released:
            self.ladder.labels(step).set(0)

    def observe_rejected(self, status: int, tenant: str) -> None:
        """A request that never reached an engine (bad input, auth, no replica)."""
        self.requests.labels("none", "none", str(status), tenant, "none").inc()

    def publish(self) -> None:
        """Write what this process holds alone into the gauges read at scrape time (its outbox backlog) and,
        under `--workers`, its own view into its file; called every second (`start`) and by `render`."""
        if self.outbox_records is not None:
            self.outbox.set(self.outbox_records())
        self.gc.publish()
        if self._worker_gauges is not None:
            self._worker_gauges.publish()

    def render(self) -> bytes:
        """The exposition text: this process's registry, or the sum of every worker's in multiprocess mode
        plus this worker's scrape-time collectors."""
        path = multiprocess_dir()
        if path is None:
            self.publish()
            return generate_latest(self.registry)
        for name, pool in self._pools().items():  # every replica present, this worker's share exact now
            for replica in pool.replicas:
                self.in_flight_changed(name, replica)
        self.publish()
        merged = CollectorRegistry()
        multiprocess.MultiProcessCollector(merged, str(path))  # type: ignore[no-untyped-call]
        merged.register(ParentCountersCollector(path))
        merged.register(WorkerGaugesCollector(path))
        return generate_latest(merged) + generate_latest(self._scrape_time)
