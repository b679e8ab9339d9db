"""The composition root's parts: everything a running gateway owns, built and closed in one place."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial

import redis.asyncio as aioredis

from backends.background import Close, close_each
from backends.clients.pool import Pool
from backends.clients.shared import EngineClient, make_engine_client
from backends.engines.args import otlp_traces_endpoint
from gateway.api.auth import OPEN_TENANT, KeyAuth
from gateway.api.auth_limits import AuthSeries, FailedAuths, UnknownKeys
from gateway.batches.lane import BatchLane
from gateway.batches.metrics import BatchMetrics
from gateway.batches.running import BatchParts, start_batches
from gateway.caching.answer_cache import AnswerCache
from gateway.caching.keys import CacheKeys
from gateway.caching.store import RedisCacheStore
from gateway.checking.judge import OutputChecker
from gateway.control.adaptation.degradation import DegradationMonitor
from gateway.control.adaptation.ladder_sync import LadderSync
from gateway.control.adaptation.live_threshold import LiveThreshold, start_live_threshold
from gateway.control.adaptation.live_tradeoff import LiveTradeoff, start_live_tradeoff
from gateway.control.fleet.autoscale import Autoscaler
from gateway.control.fleet.on_demand import OnDemandGate
from gateway.control.fleet.on_demand_shared import WorkerEngines
from gateway.control.fleet.pool_build import engine_load_read
from gateway.control.fleet.pool_set import PoolSet
from gateway.control.policy.policy_file import PolicyFile
from gateway.control.policy.policy_holder import PolicyHolder
from gateway.learning.feedback import FeedbackService
from gateway.learning.loop import LearningTap
from gateway.learning.retrain import LedgerLabelIds, RetrainSchedule, check_retrain
from gateway.learning.shadow import ShadowComparison
from gateway.learning.store import LearningStore
from gateway.learning.train_process import TrainerProcess, TrainResult
from gateway.ledger.store import Ledger, LedgerCounts, LedgerKeys, MemoryLedger
from gateway.redis_client import close_quietly, redis_from_url
from gateway.serving.embeddings import EmbeddingService
from gateway.serving.records.access_log import AccessLog
from gateway.serving.records.accounting import Accountant
from gateway.serving.records.request_log import RequestLog
from gateway.serving.records.tracing import Tracing, tracing_from_env
from gateway.serving.routing.drift_sync import DriftSync
from gateway.serving.routing.label_memories import LabelMemories
from gateway.serving.routing.placements import with_placements
from gateway.serving.routing.router import RequestRouter
from gateway.serving.routing.router_swap import RouterSwap, make_scorer
from gateway.serving.routing.versions import PoolVersions
from gateway.serving.sending.forwarding import Forwarder, Recording
from gateway.serving.sending.proxy import Proxy
from gateway.serving.service import ChatService, ServingParts
from gateway.settings import Settings
from gateway.telemetry.gc_pauses import freeze_heap
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.scoring_metrics import truncation_counter
from gateway.tenancy.admission import Admission
from gateway.tenancy.api_keys import KeyStore
from gateway.tenancy.budgets import BudgetGuard
from gateway.tenancy.limits import MemoryRateLimiter, RateLimiter, retry_stale_connections
from policies.loader import LoadedPolicy, load_policy
from policies.providers import pool_provider
from router_models.serving.artifact import default_store_dir
from router_models.serving.classifier_scorer import ClassifierScorer
from router_models.serving.scorer import Scorer

__all__ = ["Runtime", "build_runtime"]

log = logging.getLogger("cascade.runtime")


@dataclass
class Runtime:
    """Owns: the HTTP client, pools, supervisors, scorer, ledger and Redis client. `aclose` frees all."""

    settings: Settings
    policies: PolicyHolder
    engines: EngineClient
    pool_set: PoolSet
    scorer: Scorer | None
    ledger: Ledger
    accountant: Accountant
    service: ChatService
    redis: aioredis.Redis | None
    metrics: GatewayMetrics
    degradation: DegradationMonitor
    request_log: RequestLog | None
    on_demand: OnDemandGate
    router_swap: RouterSwap
    embeddings: EmbeddingService
    feedback: FeedbackService | None = None  # None without Redis (memory ledger)
    live_threshold: LiveThreshold | None = None  # a flagship_share policy's live threshold (owned)
    live_tradeoff: LiveTradeoff | None = None  # a cost_per_1k policy's live tradeoff (owned)
    drift_sync: DriftSync | None = None  # tenants' drift judged on every process's windows (owned; with Redis)
    autoscaler: Autoscaler | None = None  # where this process runs the engines (owned)
    retrain: RetrainSchedule | None = None  # policy learning.retrain (owned; started by build_runtime)
    memories: LabelMemories | None = None  # policy learning.label_memory (owned; started by build_runtime)
    access_log: AccessLog = field(default_factory=lambda: AccessLog(None))  # owned
    tracing: Tracing = field(default_factory=Tracing)  # owned: OpenTelemetry, off without an OTLP endpoint
    keys: KeyAuth = field(default_factory=lambda: KeyAuth(None))  # the policy's keys and, with Redis, issued ones
    policy_file: PolicyFile | None = None  # the policy file beside the policy served (readiness, reload metrics)
    batches: BatchParts | None = None  # the Batch API and this process's batch worker (owned; with Redis)
    _reload_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def pools(self) -> dict[str, Pool]:
        return self.pool_set.pools

    async def reload_policy(self, accept_interruption: bool = False) -> LoadedPolicy:
        """Re-read the policy file; on success start/stop pools to match, then swap it in whole. A pool whose
        engines change gets its new version started beside the old one first, so this returns once that
        version serves (seconds to minutes); a second reload waits for the first. `accept_interruption`: a
        pool the machine has no room to change side by side may restart in place (no replica meanwhile).
        Raises `PolicyError` (the running policy and pools stay as they were), also when a change is
        refused or a new engine does not start (its own error in the problems). Each outcome is noted in
        `policy_file` (readiness and metrics)."""
        try:
            fresh = await self._reload(accept_interruption)
        except Exception as exc:
            if self.policy_file is not None:
                self.policy_file.failed(exc)
            raise
        if self.policy_file is not None:
            self.policy_file.succeeded(fresh)
        return fresh

    async def _reload(self, accept_interruption: bool) -> LoadedPolicy:
        async with self._reload_lock:
            fresh = with_placements(load_policy(self.policies.current.source))
            if fresh.version == self.policies.current.version and fresh.policy.routing.tiers:
                self.policies.swap(fresh)  # the same policy with its placement files read again
            elif fresh.version != self.policies.current.version:
                check_retrain(fresh, self.settings)
                await self.pool_set.apply(fresh, accept_interruption)
                self.policies.swap(fresh)
                self.pool_set.retire_unused(fresh.policy)
                self.degradation.use_policy(fresh)  # the new ladder applies from the next tick, traffic or not
                if self.settings.gc_freeze:
                    freeze_heap("policy reload")
            return fresh

    def scorer_swapped(self, new: Scorer) -> None:
        """`RouterSwap` serves `new` now: it is the one to close, and its counters feed the metrics."""
        _observe(new, self.metrics)
        self.scorer = new

    async def redis_ok(self) -> bool:
        """Whether Redis answers a PING within 1 s. A failed connection is tried again (3 tries in all, within
        that second): after a Redis restart each pooled connection opened before fails once on its next use
        (redis-py then reopens it), and one such stale connection must not report a live Redis as down."""
        if self.redis is None:
            return True
        try:
            return bool(await asyncio.wait_for(retry_stale_connections(self.redis.ping, 3), 1.0))
        except Exception:
            return False

    async def aclose(self) -> None:
        """Close everything, in this order, each part whatever the others do: a failure is logged with the part's
        name and the rest still closes (the pools' engines above all: one left running holds its GPU)."""
        await close_each(self._parts(), log, in_turn=True)

    def _parts(self) -> list[Close]:
        """What `aclose` closes, in order, leaving out what was not built."""
        parts: list[tuple[str, Callable[[], Awaitable[object]] | None]] = [
            ("the batch worker", self.batches.aclose if self.batches else None),  # its lines go back to the queue
            ("the retraining schedule", self.retrain.aclose if self.retrain else None),  # first: a training child
            ("the label memories", self.memories.aclose if self.memories else None),
            ("the autoscaler", self.autoscaler.aclose if self.autoscaler else None),
            ("the live threshold", self.live_threshold.aclose if self.live_threshold else None),
            ("the live tradeoff", self.live_tradeoff.aclose if self.live_tradeoff else None),
            ("the drift sync", self.drift_sync.aclose if self.drift_sync else None),
            ("the degradation monitor", self.degradation.aclose), ("the on-demand gate", self.on_demand.aclose),
            ("the accountant", self.accountant.drain),
            ("the replay log", partial(asyncio.to_thread, self.request_log.close) if self.request_log else None),
            # flushes what a slow reader left queued, for 2 s at most
            ("the access log", partial(asyncio.to_thread, self.access_log.close)),
            # flushes queued spans (the exporter's timeout bounds it)
            ("the tracer", partial(asyncio.to_thread, self.tracing.shutdown)),
            ("the pools", self.pool_set.aclose), ("the router swap", self.router_swap.aclose),
            ("the scorer", self.scorer.aclose if self.scorer is not None else None), ("the ledger", self.ledger.aclose),
            ("redis", partial(close_quietly, self.redis, "the gateway") if self.redis is not None else None),
            ("the metrics", self.metrics.aclose), ("the engine client", self.engines.aclose)]
        return [(what, close) for what, close in parts if close is not None]


async def _make_ledger(settings: Settings) -> Ledger:
    if settings.ledger == "memory":
        return MemoryLedger()
    from gateway.ledger.store import RedisLedger

    ledger = RedisLedger(settings.redis_url, settings.outbox_dir, key_prefix=settings.redis_prefix,
                         retention_days=settings.ledger_retention_days)
    await ledger.start()
    return ledger


def _on_demand(pool_set: PoolSet, metrics: GatewayMetrics) -> OnDemandGate:
    """The scale-to-zero gate: this process's own, or under `--workers N` (a pool set following the parent's
    registry) one that asks the parent, which decides for every worker (`gateway.control.fleet.on_demand_shared`)."""
    if pool_set.registry is None:
        gate = OnDemandGate(pool_set)
        gate.start()
        return gate
    engines = WorkerEngines(pool_set, pool_set.registry, metrics.publish)
    metrics.register_scrape_time(engines, own_view=True)
    gate = OnDemandGate(engines)
    gate.on_use = engines.used
    return gate


def _learning(redis: aioredis.Redis | None, settings: Settings, forwarder: Forwarder, pool_set: PoolSet,
              engines: EngineClient, accountant: Accountant,
              metrics: GatewayMetrics) -> tuple[LearningTap | None, FeedbackService | None]:
    """Kept prompts, feedback and shadow verdicts live in Redis beside the ledger: none without it."""
    if redis is None:
        return None, None
    store = LearningStore(redis, settings.redis_prefix)
    shadow = ShadowComparison(forwarder, pool_set.pools, engines, accountant, store, redis, settings.redis_prefix,
                              metrics)
    feedback = FeedbackService(store, settings.ledger_retention_days * 86_400, metrics)
    return LearningTap(store, accountant, metrics, shadow), feedback


def _key_auth(redis: aioredis.Redis | None, settings: Settings, metrics: GatewayMetrics) -> KeyAuth:
    """Policy keys, and with Redis issued ones; failed authentications bounded per client address. Raises
    ValueError naming the setting for a burst below 1."""
    series = AuthSeries(metrics.registry)
    failures = FailedAuths(settings.auth_failure_burst, settings.auth_failures_per_minute, series)
    return KeyAuth(KeyStore(redis, settings.redis_prefix) if redis else None, failures=failures,
                   unknown=UnknownKeys(0.5, series=series))


def _admission(redis: aioredis.Redis | None, settings: Settings, metrics: GatewayMetrics) -> Admission:
    """Rate limits and budgets live in Redis; without it (memory ledger) they are in-process only."""
    if redis is None:
        return Admission(MemoryRateLimiter(), None, metrics)
    guard = BudgetGuard(redis, LedgerKeys(settings.redis_prefix))
    return Admission(RateLimiter(redis, settings.redis_prefix), guard, metrics, key_budget=guard)


async def build_runtime(settings: Settings, progress: Callable[[str], None] | None = None,
                        engine_client: EngineClient | None = None) -> Runtime:
    """Build everything; local engines start in the background when `settings.start_engines`
    (`Runtime.pool_set.status` tells how far they are). On failure, closes what it had built. `engine_client`: the
    client every engine request goes through (default: `make_engine_client(settings.transport)`; tests pass a fake
    one); the runtime owns and closes it either way."""
    loaded = with_placements(load_policy(settings.policy_path))
    PoolSet.check(loaded)
    check_retrain(loaded, settings)
    if not loaded.policy.tenants:
        log.warning("policy %s names no tenants: every caller is served as tenant %r, with or without a key",
                    loaded.source, OPEN_TENANT)
    policies = PolicyHolder(loaded)
    engines = make_engine_client(settings.transport) if engine_client is None else engine_client
    try:
        ledger = await _make_ledger(settings)
    except BaseException:
        await engines.aclose()
        raise
    pool_set = PoolSet(settings, engines, progress, traces_to=otlp_traces_endpoint(os.environ))
    try:
        await pool_set.start(policies.current.policy)  # local engines load in the background meanwhile:
        scorer = await asyncio.to_thread(make_scorer, settings)  # on a fresh machine the ONNX export takes ~25 s
    except BaseException:
        await pool_set.aclose()
        await ledger.aclose()
        await engines.aclose()
        raise
    metrics = GatewayMetrics(lambda: pool_set.pools)
    pool_set.on_probe_error(metrics.faults.probe_failed)
    batch_metrics = BatchMetrics(metrics.registry)
    lane = BatchLane(lambda: pool_set.pools, batch_metrics.lane_changed, batch_metrics.waiting_changed,
                     on_preempt=batch_metrics.line_preempted)
    # the batch lane reads the engines' queue and KV use while lines are in it
    pool_set.builder.load_read = lambda name: engine_load_read(policies.current.policy, name) or lane.active()
    counts = getattr(ledger, "counts", None)  # a RedisLedger's (the memory ledger keeps none)
    if isinstance(counts, LedgerCounts):
        counts.on_event = metrics.ledger_event
    metrics.outbox_records = getattr(ledger, "outbox_records", None)  # a RedisLedger's backlog on disk (a method)
    metrics.start(settings.probe_interval_s)
    pool_set.on_engine_restart = metrics.engine_restarted
    _observe(scorer, metrics)
    access_log = AccessLog(settings.access_log, settings.access_log_sample, capacity=settings.access_log_buffer,
                           on_dropped=metrics.faults.access_log_dropped)
    accountant = Accountant(ledger, metrics, access_log)
    accountant.tracing = tracing = tracing_from_env(on_export_failure=metrics.trace_export_failures.inc)
    tracing.provider_of = lambda pool: pool_provider(policies.current.policy, pool)
    degradation = DegradationMonitor(lambda: pool_set.pools, settings.probe_interval_s,
                                     on_change=metrics.ladder_changed)
    degradation.use_policy(policies.current)
    degradation.start()
    request_log = RequestLog(settings.request_log, settings.request_log_sample) if settings.request_log else None
    proxy = Proxy(engines, on_in_flight=metrics.in_flight_changed)
    proxy.tracing = tracing
    forwarder = Forwarder(proxy, engines, Recording(accountant, degradation, request_log, pool_set.guard.observe),
                          metrics, checker=OutputChecker(metrics))
    redis = redis_from_url(settings.redis_url) if settings.ledger == "redis" else None  # or a cluster's
    if redis is not None:  # one ladder for every gateway process on this Redis and prefix
        degradation.share(LadderSync(redis, settings.redis_prefix))
    admission = _admission(redis, settings, metrics)
    on_demand = _on_demand(pool_set, metrics)
    live = start_live_threshold(redis, settings.redis_prefix, lambda: policies.current.policy, metrics)
    tradeoff = start_live_tradeoff(redis, settings.redis_prefix, lambda: policies.current.policy, metrics)
    router = RequestRouter(scorer, metrics, live, tradeoff=tradeoff)
    router.memories = LabelMemories(default_store_dir() / "memory", lambda: router.scorer)
    router.memories.on_inline = metrics.memory_moves.labels("inline").inc
    router.memories.on_batch = metrics.memory_batch_moved
    router_swap = RouterSwap(settings, router)
    learning, feedback = _learning(redis, settings, forwarder, pool_set, engines, accountant, metrics)
    versions = PoolVersions(pool_set.pools, pool_set.canaries)
    cache = AnswerCache(RedisCacheStore(redis) if redis is not None else None, CacheKeys(settings.redis_prefix), router,
                        accountant, metrics)
    parts = ServingParts(versions, router, forwarder, admission, degradation, metrics, wake=on_demand.ensure,
                         cache=cache, keep_requests=request_log is not None, lane=lane, sleeping=on_demand.sleeping)
    service = ChatService(policies, parts, learning=learning)
    embeddings = EmbeddingService(policies, parts, accountant)
    runtime = Runtime(settings, policies, engines, pool_set, scorer, ledger, accountant, service, redis, metrics,
                      degradation, request_log, on_demand, router_swap, embeddings, feedback, live_threshold=live,
                      live_tradeoff=tradeoff,
                      access_log=access_log, tracing=tracing,
                      keys=_key_auth(redis, settings, metrics))
    router_swap.on_swap = runtime.scorer_swapped
    runtime.policy_file = PolicyFile(lambda: policies.current)
    runtime.policy_file.attach(metrics)
    runtime.retrain = _retrain(runtime)
    runtime.retrain.start()
    runtime.memories = router.memories
    runtime.memories.start()
    if redis is not None:  # one drift judgement for every process on this Redis and prefix
        runtime.drift_sync = DriftSync(redis, settings.redis_prefix, router.drift)
        runtime.drift_sync.start()
    if redis is not None:
        runtime.batches = start_batches(redis, settings, policies, service, embeddings, lane, batch_metrics)
    if settings.start_engines:
        runtime.autoscaler = Autoscaler(pool_set, degradation.signals, metrics.scale_event, settings.probe_interval_s)
        runtime.autoscaler.start()
    return runtime


def _retrain(runtime: Runtime) -> RetrainSchedule:
    """The retraining schedule (`gateway.learning.retrain`): a promotion is swapped in here at once, and in the
    other processes on the store by their watchers."""
    settings, metrics = runtime.settings, runtime.metrics

    def finished(result: TrainResult, at: float) -> None:
        metrics.retrain_finished(result.outcome, at, result.apgr_delta)

    return RetrainSchedule(settings, lambda: runtime.policies.current, runtime.redis,
                           TrainerProcess(settings.redis_url, settings.redis_prefix),
                           LedgerLabelIds(settings.redis_url, settings.redis_prefix), on_result=finished,
                           swap=runtime.router_swap.reload)


def _observe(scorer: Scorer | None, metrics: GatewayMetrics) -> None:
    """Attach the scorer's batch, per-model and truncation counters to the metrics (the trained classifier has them)."""
    if isinstance(scorer, ClassifierScorer):
        scorer.on_batch = metrics.scoring_batch.observe
        scorer.on_scored = metrics.router_scored
        scorer.on_truncated = truncation_counter(metrics.registry)
