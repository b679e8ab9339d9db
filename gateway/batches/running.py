"""The batches' parts of a running gateway, built in one place: the service the routes call and this process's
worker (started here; `aclose` stops it). Batches need Redis: a gateway without it (the memory ledger) has none, and
its batch routes answer 400 saying so."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

import redis.asyncio as aioredis

from gateway.batches.expiry import FileExpiry
from gateway.batches.files import FileStore
from gateway.batches.finalize import Finalizer
from gateway.batches.lane import BatchLane
from gateway.batches.metrics import BatchMetrics
from gateway.batches.queue import LineQueue
from gateway.batches.runner import LineRunner
from gateway.batches.service import BatchService
from gateway.batches.store import BatchStore
from gateway.batches.worker import BatchWorker
from gateway.control.policy.policy_holder import PolicyHolder
from gateway.serving.embeddings import EmbeddingService
from gateway.serving.service import ChatService
from gateway.settings import Settings
from gateway.tenancy.api_keys import KeyStore

__all__ = ["BatchParts", "batch_folder", "start_batches"]


@dataclass
class BatchParts:
    """Owns the worker; shares the rest (`store`, `queue`, `runner`: what the worker uses, for tests and tools)."""

    service: BatchService
    worker: BatchWorker
    store: BatchStore
    queue: LineQueue
    runner: LineRunner

    async def aclose(self) -> None:
        await self.worker.aclose()


def batch_folder(settings: Settings, policies: PolicyHolder) -> Path:
    """The policy's `batches.folder` (relative to the state folder), else `<home>/batches`."""
    folder = policies.current.policy.batches.folder
    return settings.home / (folder or "batches")


def start_batches(redis: aioredis.Redis, settings: Settings, policies: PolicyHolder, chat: ChatService,
                  embeddings: EmbeddingService, lane: BatchLane, metrics: BatchMetrics) -> BatchParts:
    """The service and a started worker, named after this host and process in the workers' consumer group."""
    store = BatchStore(redis, settings.redis_prefix)
    queue = LineQueue(redis, store)
    files = FileStore(batch_folder(settings, policies))
    consumer = f"{socket.gethostname()}-{os.getpid()}-{os.urandom(3).hex()}"
    runner = LineRunner(chat, embeddings, policies, settings, lane, keys=KeyStore(redis, settings.redis_prefix))
    worker = BatchWorker(store, queue, runner, Finalizer(store, queue, files, policies, consumer), policies, metrics,
                         consumer, expiry=FileExpiry(store, files))
    worker.start()
    return BatchParts(BatchService(store, queue, files, policies), worker, store, queue, runner)
