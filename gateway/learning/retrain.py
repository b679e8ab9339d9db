"""Retraining the router on a schedule (policy `learning.retrain`), in one gateway process per artifact store.

Every gateway process runs a `RetrainSchedule`. Every `check_s` (60 s) it asks whether a look at the labels
is due: `every_hours` after the last look, whose time lives in Redis, so that a restart or another worker
neither repeats nor resets the schedule (the first look ever comes at once). A due look is taken by the one
process that gets the store's lock, which checks the time again under it:

1. count the labelled requests of the ledger (`read_ledger_label_ids`, in a worker thread) and those the last
   completed training did not see; fewer than `min_new_labels` new: ``skipped``, logged with the counts;
2. else train in a child process (`gateway.learning.train_process`: ``promoted``, ``not_better`` or
   ``failed``). The training promotes into the artifact store only a candidate better on the held-back labels;
   the store watcher of every gateway process on it (`gateway.serving.routing.router_swap`, `FileWatcher`) then swaps
   the new artifact in: checked before it serves, the old one drained. The process that trained also reloads
   at once (`swap`), which covers a gateway that watches no files (`policy_watch_interval_s` 0).

After ``promoted`` or ``not_better`` the labelled ids counted in step 1 become the seen ones (a label that
arrives during the training counts as new next time). A ``failed`` training leaves them, so the next look
trains again. Every outcome records the look's time: the next comes `every_hours` later. Each look is logged
(one line with the outcome and its detail: the verdict says by how much) and counted
(`cascade_router_retrain_runs_total{outcome}`, `..._last_run_timestamp_seconds`, `..._last_apgr_delta`).

Redis keys under ``<prefix>router:retrain:{<store>}:``, <store> the first 12 hex of sha256(host name, store
folder): ``lock`` (a random token; PX the training deadline + 2 min, so a process that died frees it),
``state`` (hash: at (UTC epoch s), outcome, detail, version, labels, new) and ``seen`` (set of request ids).
One lock per store, not per Redis: the workers of `cascade serve --workers N` share their host's store and
one of them trains; gateways on separate hosts each own a store and retrain it (a promotion reaches only the
store it is written into). Several hosts sharing one store folder over the network would each train it.

Refused at load (and at a reload: `check_retrain`, a `PolicyError` naming the policy's line) on a Redis Cluster
ledger (`redis+cluster://`): the label reader and the trainer read one Redis, so every look would fail.

Not run where a promotion would not reach what this gateway serves: `--router-artifact` or
`$CASCADE_ROUTER_ARTIFACT` (it serves that file, not the store), `--scorer length|none`, or the memory ledger
(no labels). That is a warning, once per policy version, naming the policy's line, not a refused policy: a
gateway pinned to one artifact beside gateways that serve the store is a legitimate deployment on one policy.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

import redis.asyncio as aioredis

from backends.background import stop
from gateway.learning.train_process import Trainer, TrainResult
from gateway.redis_client import is_cluster_url
from gateway.settings import Settings
from policies.learning import Retrain
from policies.loader import LoadedPolicy, PolicyError
from router_models.serving.artifact import default_store_dir

__all__ = ["LabelSource", "LedgerLabelIds", "RetrainKeys", "RetrainSchedule", "check_retrain", "store_problem"]

log = logging.getLogger("cascade.retrain")

_LOCK_MARGIN_S = 120  # beyond the training's deadline (and `timeout -k`): the lock outlives any child
_RELEASE = """if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"""
_SEEN_BATCH = 1000


class LabelSource(Protocol):
    async def label_ids(self) -> set[str]:
        """Request ids of the labelled requests in the ledger now. Raises `redis.RedisError`."""
        ...


class LedgerLabelIds:
    """The ledger's labelled requests (`router_models.training.ledger_labels.read_ledger_label_ids`: the ids
    that the training's reader would give rows for, without their prompt texts), read in a worker thread."""

    def __init__(self, redis_url: str, prefix: str) -> None:
        self._url = redis_url
        self._prefix = prefix

    async def label_ids(self) -> set[str]:
        from router_models.training.ledger_labels import read_ledger_label_ids

        return await asyncio.to_thread(read_ledger_label_ids, self._url, key_prefix=self._prefix)


class RetrainKeys:
    """The schedule's Redis keys for the store at `store` on this host (module docstring)."""

    def __init__(self, prefix: str, store: str, host: str | None = None) -> None:
        tag = hashlib.sha256(f"{host or socket.gethostname()}\0{store}".encode()).hexdigest()[:12]
        base = f"{prefix}router:retrain:{{{tag}}}:"
        self.lock, self.state, self.seen = base + "lock", base + "state", base + "seen"


def check_retrain(loaded: LoadedPolicy, settings: Settings) -> None:
    """Refuse a policy that turns retraining on for a gateway whose ledger is a Redis Cluster (the labels and the
    training read one Redis); raises `PolicyError` with the policy's file:line."""
    if (loaded.policy.learning.retrain.every_hours == 0 or settings.ledger != "redis"
            or not is_cluster_url(settings.redis_url)):
        return
    why = ("retraining reads its labels from one Redis, and this gateway's ledger is a Redis Cluster "
           f"({settings.redis_url.split('://', 1)[0]}://): set every_hours to 0 here, and retrain with `cascade "
           "router train --from-ledger` against a single Redis copy of the ledger")
    raise PolicyError(loaded.source, [loaded.at(("learning", "retrain", "every_hours"), why)])


def store_problem(settings: Settings) -> str | None:
    """Why a promotion into the store would not reach what a gateway with `settings` serves (None: it would)."""
    named = settings.router_artifact or os.environ.get("CASCADE_ROUTER_ARTIFACT")
    if settings.scorer != "classifier":
        return f"this gateway runs --scorer {settings.scorer}: no trained router to retrain"
    if named:
        return (f"this gateway serves {named} (--router-artifact or $CASCADE_ROUTER_ARTIFACT), not the artifact "
                f"store {default_store_dir()} that retraining promotes into; serve the store (drop the option) "
                "or set every_hours to 0")
    if settings.ledger != "redis":
        return "this gateway runs with --ledger memory: it keeps no labels to retrain on"
    return None


class RetrainSchedule:
    """Owns its task (`start` / `aclose`) and, while it trains, the child process; shares the Redis client.

    `policy()` is the policy now (read at every look, so a reload turns retraining on or off); `clock()` is
    UTC epoch seconds (tests pass a fake); `on_result(result, at)` is told of every look taken (metrics);
    `swap()` serves the promoted artifact in this process at once."""

    def __init__(self, settings: Settings, policy: Callable[[], LoadedPolicy], redis: aioredis.Redis | None,
                 trainer: Trainer, labels: LabelSource, keys: RetrainKeys | None = None,
                 on_result: Callable[[TrainResult, float], None] | None = None,
                 swap: Callable[[], Awaitable[object]] | None = None,
                 clock: Callable[[], float] = time.time, check_s: float = 60.0) -> None:
        self._settings = settings
        self._policy = policy
        self._redis = redis
        self._trainer = trainer
        self._labels = labels
        self._keys = keys or RetrainKeys(settings.redis_prefix, str(default_store_dir()))
        self._on_result = on_result
        self._swap = swap
        self._clock = clock
        self._check_s = check_s
        self._warned: str | None = None  # the policy version last warned about
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="router-retrain")

    async def aclose(self) -> None:
        await stop(self._task, patience_s=30.0)  # a running training is stopped (`train_process._stop`)
        self._task = None

    async def _loop(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception as exc:  # Redis away, for one: the next look tries again
                log.warning("retrain: look failed, trying again in %.0f s: %s", self._check_s, exc)
            await asyncio.sleep(self._check_s)

    async def tick(self) -> TrainResult | None:
        """Take the look if one is due and this process gets the lock; None when not (off, not due, another
        process has it, or this gateway cannot retrain: then a warning). Raises `redis.RedisError`."""
        loaded = self._policy()
        retrain = loaded.policy.learning.retrain
        if retrain.every_hours == 0 or not self._can_retrain(loaded) or self._redis is None:
            return None
        if not await self._due(self._redis, retrain):
            return None
        token = secrets.token_hex(16)
        ttl_ms = (retrain.timeout_minutes * 60 + _LOCK_MARGIN_S) * 1000
        if not await self._redis.set(self._keys.lock, token, nx=True, px=ttl_ms):
            return None
        try:
            if not await self._due(self._redis, retrain):  # another process looked just before
                return None
            return await self._look(self._redis, retrain)
        finally:
            await self._redis.eval(_RELEASE, 1, self._keys.lock, token)

    def _can_retrain(self, loaded: LoadedPolicy) -> bool:
        problem = store_problem(self._settings)
        if problem is not None and self._warned != loaded.version:
            self._warned = loaded.version
            log.warning("retrain: %s", loaded.at(("learning", "retrain", "every_hours"),
                                                 f"retraining is on but does not run here: {problem}"))
        return problem is None

    async def _due(self, redis: aioredis.Redis, retrain: Retrain) -> bool:
        last = await redis.hget(self._keys.state, "at")
        return last is None or self._clock() - float(last) >= retrain.every_hours * 3600

    async def _look(self, redis: aioredis.Redis, retrain: Retrain) -> TrainResult:
        at = self._clock()
        ids = await self._labels.label_ids()
        seen = {m.decode() if isinstance(m, bytes) else str(m) for m in await redis.smembers(self._keys.seen)}
        new = len(ids - seen)
        if new < retrain.min_new_labels:
            result = TrainResult("skipped", f"{new} labelled requests are new since the last training "
                                 f"({len(ids)} in the ledger), fewer than min_new_labels {retrain.min_new_labels}")
        else:
            log.info("retrain: training on %d labelled requests (%d new)", len(ids), new)
            result = await self._trainer.run(retrain)
        if result.outcome in ("promoted", "not_better"):
            await self._remember(redis, ids)
        await redis.hset(self._keys.state, mapping={"at": f"{at:.3f}", "outcome": result.outcome,
                                                    "detail": result.detail, "version": result.version or "",
                                                    "labels": str(len(ids)), "new": str(new)})
        self._report(result, at)
        if result.outcome == "promoted" and self._swap is not None:
            await self._swap_in()
        return result

    async def _remember(self, redis: aioredis.Redis, ids: set[str]) -> None:
        ordered = sorted(ids)
        async with redis.pipeline(transaction=True) as pipe:
            pipe.delete(self._keys.seen)
            for i in range(0, len(ordered), _SEEN_BATCH):
                pipe.sadd(self._keys.seen, *ordered[i : i + _SEEN_BATCH])
            await pipe.execute()

    def _report(self, result: TrainResult, at: float) -> None:
        level = logging.WARNING if result.outcome == "failed" else logging.INFO
        version = f" version {result.version}" if result.version else ""
        log.log(level, "retrain: %s%s: %s", result.outcome, version, result.detail,
                extra={"retrain_outcome": result.outcome, "router_version": result.version})
        if self._on_result is not None:
            self._on_result(result, at)

    async def _swap_in(self) -> None:
        assert self._swap is not None
        try:
            await self._swap()
        except Exception as exc:  # the running router stays; the watcher tries again on the next change
            log.error("retrain: the promoted artifact was not swapped in here: %s", exc)
