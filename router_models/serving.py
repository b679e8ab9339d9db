"""The serving-side scorer: a micro-batcher and a TTL cache in front of embedder + classifier.

Concurrent `score` calls put their cache misses on one queue. A single collector task takes the first
waiting text, gathers more for up to `max_wait_ms` (or until `max_batch`), de-duplicates them and scores
the batch in ONE call on a dedicated single-thread executor, so the event loop never runs model code and
batches never compete with each other for the CPU. While a batch runs, new texts queue up and form the
next batch: under load, batches grow by themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from router_models.artifact import ArtifactError, load_artifact
from router_models.cache import TTLCache
from router_models.classifier import LinearRouter, feature_matrix
from router_models.embedder import Embedder, make_embedder, parse_name
from router_models.features import FEATURE_NAMES

__all__ = ["BatchModel", "BatchingConfig", "ClassifierScorer", "EmbeddingClassifier", "load_model", "load_scorer"]


class BatchModel(Protocol):
    """Synchronous, CPU-bound: scores a batch of texts, one float in [0, 1] per text, in order."""

    def __call__(self, texts: Sequence[str]) -> list[float]: ...


class EmbeddingClassifier:
    """`BatchModel` of an embedder and a trained `LinearRouter`."""

    def __init__(self, embedder: Embedder, router: LinearRouter) -> None:
        self._embedder = embedder
        self._router = router

    def __call__(self, texts: Sequence[str]) -> list[float]:
        feats = feature_matrix(self._embedder.embed(texts), texts)
        return [float(p) for p in self._router.predict_proba(feats)]


@dataclass(frozen=True)
class BatchingConfig:
    """Micro-batching and cache knobs. Times in milliseconds / seconds as named."""

    max_wait_ms: float = 2.0
    max_batch: int = 32
    cache_entries: int = 10_000
    cache_ttl_s: float = 300.0


_Item = tuple[str, "asyncio.Future[float]"]


class ClassifierScorer:
    """`Scorer` over a `BatchModel`, with micro-batching and an LRU+TTL cache.

    Owns its executor thread and collector task; `aclose()` stops both and fails queued calls.
    Use from one event loop. `batch_sizes` keeps the size of the latest batches sent to the model, and
    `on_batch(size)`, when set, is called with each (e.g. a metrics histogram's `observe`).
    """

    def __init__(
        self, model: BatchModel, config: BatchingConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._model = model
        self._config = config or BatchingConfig()
        self.cache = TTLCache(self._config.cache_entries, self._config.cache_ttl_s, clock)
        self._queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="router-scorer")
        self._collector: asyncio.Task[None] | None = None
        self._closed = False
        self.batch_sizes: deque[int] = deque(maxlen=10_000)
        self.on_batch: Callable[[int], None] | None = None

    async def score(self, texts: Sequence[str]) -> list[float]:
        """One P(micro falls short) per text, in order. Cached texts are answered without the model."""
        if self._closed:
            raise RuntimeError("scorer is closed")
        results: list[float | None] = [self.cache.get(t) for t in texts]
        pending = [(i, self._enqueue(t)) for i, t in enumerate(texts) if results[i] is None]
        if pending:
            values = await asyncio.gather(*(fut for _, fut in pending))
            for (i, _), value in zip(pending, values, strict=True):
                results[i] = value
        return [float(r) for r in results if r is not None]

    def _enqueue(self, text: str) -> asyncio.Future[float]:
        loop = asyncio.get_running_loop()
        if self._collector is None:
            self._collector = loop.create_task(self._collect(), name="router-scorer-collector")
        fut: asyncio.Future[float] = loop.create_future()
        self._queue.put_nowait((text, fut))
        return fut

    async def _next_batch(self) -> list[_Item]:
        loop = asyncio.get_running_loop()
        batch = [await self._queue.get()]
        deadline = loop.time() + self._config.max_wait_ms / 1000.0
        while len(batch) < self._config.max_batch:
            if not self._queue.empty():
                batch.append(self._queue.get_nowait())
                continue
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(self._queue.get(), remaining))
            except TimeoutError:
                break
        return batch

    async def _collect(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._next_batch()
            live = [(t, f) for t, f in batch if not f.done()]
            if not live:
                continue
            unique = list(dict.fromkeys(t for t, _ in live))
            self.batch_sizes.append(len(unique))
            if self.on_batch is not None:
                self.on_batch(len(unique))
            try:
                values = await loop.run_in_executor(self._executor, self._model, unique)
            except Exception as exc:  # the model failed: every caller in this batch gets the error
                for _, fut in live:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            by_text = dict(zip(unique, values, strict=True))
            for text, value in by_text.items():
                self.cache.put(text, value)
            for text, fut in live:
                if not fut.done():
                    fut.set_result(by_text[text])

    async def aclose(self) -> None:
        """Stop the collector, fail queued calls, release the worker thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._collector is not None:
            self._collector.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._collector
        while not self._queue.empty():
            _, fut = self._queue.get_nowait()
            if not fut.done():
                fut.set_exception(RuntimeError("scorer closed"))
        await asyncio.to_thread(self._executor.shutdown, True)


def set_torch_threads(threads: int) -> None:
    """Pin torch's intra-op threads (the embedder's matmuls). Process-wide.

    Measured with loadtest/scorer_bench.py on the shared 2-core machine: 2 threads sustained ~169 scored/s
    (p99 109 ms at 100 req/s offered) against ~148/s (p99 255 ms) with 1 thread, so 2 is the default.
    """
    import torch

    torch.set_num_threads(threads)


def load_model(
    artifact_path: str | None = None, torch_threads: int | None = 2, embedder_name: str | None = None
) -> EmbeddingClassifier:
    """Load and verify the artifact (default: the shipped one) and its embedder, warmed up. Takes seconds.

    `torch_threads`: intra-op threads of the embedder (torch's process-wide pool, or the ONNX Runtime
    session's). `embedder_name` overrides the artifact's embedder (benchmarks only: the caller vouches that
    its vectors are equivalent). Raises `ArtifactError` for a missing, corrupt or incompatible artifact.
    """
    art = load_artifact(Path(artifact_path) if artifact_path else None)
    name = embedder_name or art.embedder
    if torch_threads is not None and parse_name(name).backend == "torch":
        set_torch_threads(torch_threads)
    embedder = make_embedder(name, threads=torch_threads)
    if art.router.dim != embedder.dim + len(FEATURE_NAMES):
        raise ArtifactError(
            f"router artifact expects {art.router.dim} features but {embedder.name} gives "
            f"{embedder.dim} + {len(FEATURE_NAMES)}; retrain with `cascade router train`"
        )
    model = EmbeddingClassifier(embedder, art.router)
    model(["warm-up"])  # the first call pays one-off allocation costs
    return model


def load_scorer(
    artifact_path: str | None = None, config: BatchingConfig | None = None, torch_threads: int | None = 2
) -> ClassifierScorer:
    """The gateway's scorer: `load_model` behind a micro-batcher and cache. Takes seconds: call it at
    start-up (the gateway's lifespan), never at import time. Raises `ArtifactError` for a missing, corrupt
    or incompatible artifact. The caller owns the scorer and must `await scorer.aclose()`."""
    return ClassifierScorer(load_model(artifact_path, torch_threads), config)
