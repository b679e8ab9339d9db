"""The serving-side scorer: a micro-batcher and a TTL cache in front of embedder + classifier.

What is scored is a conversation: its scoring text and its shape (`scorer.ConversationShape`; a text alone is a
plain prompt). The cache keys on both: the same latest turn after a long history is another conversation.
Concurrent `score` calls put their cache misses on one queue. `workers` threads (`batch_threads`) each take
whatever is waiting, up to `max_batch` texts, optionally wait up to `max_wait_ms` for more, de-duplicate them and
score the batch in ONE model call, then post the answers back to the event loop in one callback: the event loop
never runs model code and at most `workers` batches run at once. While the workers are busy, new texts queue up
and form the next batches: under load, batches grow by themselves, and at low load a text is scored the moment it
arrives (no collection window by default).

The model must tolerate `workers` concurrent calls (the ONNX embedder does: one session, one intra-op thread
per call; the torch fallback serialises itself).

Overflow: a scorer may also hold a cheaper `overflow` model (the gateway's default pairs the transformer artifact
with the static one, trained on the same data and target, on the same score scale). When a worker takes a
batch whose last text would be answered later than `overflow_after_ms` after the oldest one arrived (its wait
so far plus the batch's other texts at the primary's measured time per text), that batch is scored by the
overflow model instead. At ordinary load every text gets the primary's score; in a surge the queue cannot run away, and
`scored_by` (and `on_scored`) say how many texts each model scored. Overflow scores are not cached: the same
text asked again once the surge is over gets the primary's score.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from router_models.embedders.concat import part_names
from router_models.embedders.factory import make_embedder
from router_models.embedders.features import FEATURE_NAMES
from router_models.embedders.protocol import FloatArray, parse_name
from router_models.serving.artifact import (
    ArtifactError,
    artifact_version,
    current_artifact_path,
    load_artifact,
    overflow_artifact,
)
from router_models.serving.batch_model import (
    BatchModel,
    BatchScores,
    EmbeddingClassifier,
    EmbeddingModel,
    FeatureModel,
    score_texts,
)
from router_models.serving.batch_threads import BatchThreads
from router_models.serving.blas_threads import scoring_threads
from router_models.serving.classifier import LinearRouter
from router_models.serving.domain import DomainReference
from router_models.serving.pool_map import PoolMap, pool_map_for
from router_models.serving.refined_model import (
    SHIPPED_BAND,
    RefinedClassifier,
    refine_choice,
    refine_front,
    rows_artifact,
)
from router_models.serving.scorer import SCORING_CHARS, ConversationShape, prompt_shape
from router_models.serving.ttl_cache import TTLCache

__all__ = ["BatchModel", "BatchScores", "BatchingConfig", "ClassifierScorer", "EmbeddingClassifier", "EmbeddingModel",
           "FeatureModel", "load_model", "load_scorer", "score_texts"]

_log = logging.getLogger(__name__)
_EWMA = 0.1  # weight of the latest batch in the primary's time per text


@dataclass(frozen=True)
class BatchingConfig:
    """Micro-batching and cache knobs. Times in milliseconds / seconds as named.

    `workers`: model calls in flight at once (threads). Measured with loadtest/bench/scorer.py on 2 cores
    (BENCHMARKS.md, "Scorer speed"): two workers on one-thread ONNX sessions beat one worker on a two-thread
    session. A collection window (`max_wait_ms` > 0) adds its length to every lone request's latency and buys
    little: a batch of 8 costs only ~20% less per text than 8 singles, and under load batches form by themselves
    while the workers are busy.

    `overflow_after_ms`: with an overflow model attached, a batch whose last text would wait longer than this
    for the primary model is scored by the overflow model (see the module docstring).
    """

    max_wait_ms: float = 0.0
    max_batch: int = 16
    cache_entries: int = 10_000
    cache_ttl_s: float = 300.0
    workers: int = 2
    overflow_after_ms: float = 10.0


_Scored = tuple[float, str]  # a score and the model that gave it ("primary" | "overflow")
_Key = tuple[str, ConversationShape]  # what is scored, and cached: the scoring text and the conversation's shape
_Item = tuple[_Key, "asyncio.Future[_Scored]", float]  # what, its caller's future, when queued (time.monotonic)


def _timed(model: BatchModel, keys: list[_Key], embed: bool,
           domain: DomainReference | None = None) -> tuple[BatchScores, float]:
    """`score_texts` of the keys, and the seconds it took."""
    started = time.perf_counter()
    scored = score_texts(model, [text for text, _ in keys], [shape for _, shape in keys], embed, domain)
    return scored, time.perf_counter() - started


class ClassifierScorer:
    """`Scorer` over a `BatchModel`, with micro-batching and an LRU+TTL cache.

    Owns its worker threads (`batch_threads`); `aclose()` stops them and fails queued and in-flight calls.
    Use from one event loop. `batch_sizes` keeps the size of the latest batches sent to the model, and
    `on_batch(size)`, when set, is called with each (e.g. a metrics histogram's `observe`). `overflow` (or
    `load_overflow_in_background`) attaches the cheaper model; `scored_by` counts texts per model ("primary",
    "overflow") and `on_scored(model, texts)`, when set, is called with each batch.

    A primary model that gives its embeddings (`EmbeddingModel`) has them kept beside the scores, under the same
    bounds (`embedding(text)`, in the space `embedding_space` names; 384 float32 a text for the shipped embedder, so
    about 15 MB at the default 10,000 entries): the response cache's semantic mode reads the vector the router
    computed instead of embedding the text a second time. Overflow scores keep none (another vector space).

    A primary model that also gives the structural columns it scored from (`FeatureModel`: the trained classifier)
    has them kept too, per conversation (text and shape, as the scores), so `features(text, shape)` is the whole
    feature row the score came from (`keeps_features`; label memories whose similarity reads the structural
    columns use it). Nothing is computed for it: the columns are the worker thread's, kept (22 float32 a
    conversation).

    With a `domain` reference (`router_models.serving.domain`, on the primary's embedder), each primary batch also
    gets its in-domain figures, computed in the same worker thread from the same embeddings and kept beside them
    (`in_domain(text)`); an overflow score has none.
    """

    def __init__(
        self, model: BatchModel, config: BatchingConfig | None = None,
        clock: Callable[[], float] = time.monotonic, overflow: BatchModel | None = None, version: str = "",
        domain: DomainReference | None = None,
    ) -> None:
        self._model = model
        self.domain = domain
        self.pool_map: PoolMap | None = None  # the pool map on this scorer's feature rows (`load_scorer` sets it)
        self.version = version  # the primary artifact's: every answer and cost record names it
        self.overflow = overflow
        self.scored_by = {"primary": 0, "overflow": 0}
        self.on_scored: Callable[[str, int], None] | None = None
        self._primary_s_per_text = 0.0  # measured, EWMA over batches: the overflow decision's cost estimate
        self.overflow_loader: threading.Thread | None = None  # `load_overflow_in_background`'s thread
        self._config = config or BatchingConfig()
        if self._config.workers < 1 or self._config.max_batch < 1:
            raise ValueError(f"workers and max_batch must be >= 1, got {self._config}")
        self.cache: TTLCache[_Key, float] = TTLCache(self._config.cache_entries, self._config.cache_ttl_s, clock)
        self.embedding_space = model.embedder_name if isinstance(model, EmbeddingModel) else ""
        self._vectors: TTLCache[str, FloatArray] = TTLCache(
            self._config.cache_entries if self.embedding_space else 0, self._config.cache_ttl_s, clock)
        self.keeps_features = bool(self.embedding_space) and isinstance(model, FeatureModel)
        self._structure: TTLCache[_Key, FloatArray] = TTLCache(
            self._config.cache_entries if self.keeps_features else 0, self._config.cache_ttl_s, clock)
        self._figures: TTLCache[str, float] = TTLCache(
            self._config.cache_entries if self.embedding_space and domain is not None else 0,
            self._config.cache_ttl_s, clock)
        self._threads: BatchThreads[_Item] = BatchThreads(
            self._run_batch, self._config.workers, self._config.max_batch, self._config.max_wait_ms / 1000.0,
            "router-scorer")
        self._waiting: set[asyncio.Future[_Scored]] = set()  # callers not yet answered (aclose fails them)
        self._closed = False
        self.batch_sizes: deque[int] = deque(maxlen=10_000)
        self.on_batch: Callable[[int], None] | None = None
        self.refined = 0  # texts a two-stage primary (`RefinedClassifier`) re-scored with its refiner
        self.truncated = {"chars": 0, "tokens": 0}
        self.on_truncated: Callable[[str, int], None] | None = None
        """Told of texts cut: "chars" (at `SCORING_CHARS`), "tokens" (by the embedder, at its word-piece limit;
        counted per text embedded, so not again for a cached score). The gateway's metrics count them."""

    def refine_near(self, *thresholds: float) -> None:
        """Centre a two-stage model's refine band on the thresholds in use (`RefinedClassifier.refine_near`); the
        cached scores go when the band moves (a text near the new thresholds was maybe not refined). No-op for any
        other model."""
        if isinstance(self._model, RefinedClassifier) and self._model.refine_near(*thresholds):
            self.cache.clear()

    def _count(self, what: str, texts: int) -> None:
        if texts:
            self.truncated[what] += texts
            if self.on_truncated is not None:
                self.on_truncated(what, texts)

    async def score(self, texts: Sequence[str]) -> list[float]:
        """One P(micro falls short) per text, each a plain prompt, in order. Cached ones are answered without
        the model."""
        if self._closed:
            raise RuntimeError("scorer is closed")
        if len(texts) == 1:  # one future, no gather
            return [(await self.score_one(texts[0]))[0]]
        keys = [(t[:SCORING_CHARS], prompt_shape(t)) for t in texts]
        self._count("chars", sum(1 for t in texts if len(t) >= SCORING_CHARS))
        results: list[float | None] = [self.cache.get(k) for k in keys]
        pending = [(i, self._enqueue(k)) for i, k in enumerate(keys) if results[i] is None]
        if pending:
            values = await asyncio.gather(*(fut for _, fut in pending))
            for (i, _), (value, _) in zip(pending, values, strict=True):
                results[i] = value
        return [float(r) for r in results if r is not None]

    async def score_one(self, text: str, shape: ConversationShape | None = None) -> tuple[float, str]:
        """The gateway's case: one conversation's score (None `shape`: a plain prompt) and the model that gave it
        (a cached score is the primary's). A text longer than `SCORING_CHARS` is scored on its first
        `SCORING_CHARS` characters (as the router was trained, and as `conversation_text` cuts a conversation;
        a plain prompt keeps the shape of its whole text, as in training): counted in `truncated["chars"]`."""
        if self._closed:
            raise RuntimeError("scorer is closed")
        if len(text) >= SCORING_CHARS:
            self._count("chars", 1)
            key = (text[:SCORING_CHARS], shape if shape is not None else prompt_shape(text))
            text = key[0]
        else:
            key = (text, shape if shape is not None else prompt_shape(text))
        cached = self.cache.get(key)
        if cached is None:
            return await self._enqueue(key)
        self._vectors.get(text)  # kept as recently used as its score: evicted together
        self._structure.get(key)
        self._figures.get(text)
        return cached, "primary"

    @property
    def router(self) -> LinearRouter | None:
        """The primary model's trained head (an `EmbeddingClassifier`'s), None for another model."""
        return self._model.router if isinstance(self._model, EmbeddingClassifier) else None

    def embedding(self, text: str) -> FloatArray | None:
        """The primary model's embedding of `text`, kept when it scored it (None: not scored by it, expired or
        evicted, or a model without embeddings). Row vector, not normalised; do not modify it."""
        return self._vectors.peek(text)

    def features(self, text: str, shape: ConversationShape | None = None) -> FloatArray | None:
        """The whole feature row the primary model scored this conversation from (None `shape`: a plain prompt):
        its embedding, then its structural columns, both kept when it scored it; None when either is not kept
        (not scored by it, expired or evicted, or a model that gives no structural columns). A new (dim,) row."""
        vector = self._vectors.peek(text)
        structure = self._structure.peek((text, shape if shape is not None else prompt_shape(text)))
        if vector is None or structure is None:
            return None
        return np.asarray(np.concatenate([vector, structure]), np.float32)

    def in_domain(self, text: str) -> float | None:
        """The in-domain figure of `text` (`router_models.serving.domain`), kept when the primary model scored it;
        None without a domain reference, or when not scored by the primary (or expired, evicted)."""
        return self._figures.peek(text)

    def _enqueue(self, key: _Key) -> asyncio.Future[_Scored]:
        fut: asyncio.Future[_Scored] = asyncio.get_running_loop().create_future()
        self._waiting.add(fut)
        fut.add_done_callback(self._waiting.discard)  # answered, failed or cancelled (its caller left): not waiting
        self._threads.put((key, fut, time.monotonic()))
        return fut

    def _pick(self, oldest: float | None, texts: int, now: float) -> tuple[str, BatchModel]:
        """The model for this batch: the overflow one when the primary would answer its last text too late.

        `oldest`: when the batch's oldest text that queued was queued (None: none queued). The texts after the first
        are counted at the primary's measured time per text; the first is not, so a lone text that did not wait
        always goes to the primary (and keeps its time per text up to date)."""
        overflow = self.overflow
        if overflow is not None:
            waited = 0.0 if oldest is None else now - oldest
            if (waited + (texts - 1) * self._primary_s_per_text) * 1000.0 > self._config.overflow_after_ms:
                return "overflow", overflow
        return "primary", self._model

    def _run_batch(self, batch: list[_Item], idle: bool) -> None:
        """A worker thread's batch: picked, scored in one model call, its answers posted to the callers' loop in one
        callback (`_answer`), the model's failure included. Touches no cache and no future: the loop does. `idle`:
        the first text came while the thread waited for work, so it did not queue (its wait was the wake-up)."""
        live = [item for item in batch if not item[1].done()]  # a caller gone (cancelled) is not scored
        if not live:
            return
        unique = list(dict.fromkeys(key for key, _, _ in live))
        queued = [at for _, _, at in (batch[1:] if idle else batch)]
        which, cut, refined = "primary", 0, 0
        outcome: BatchScores | Exception
        try:
            which, model = self._pick(min(queued) if queued else None, len(unique), time.monotonic())
            embed = which == "primary" and bool(self.embedding_space)
            outcome, took_s = _timed(model, unique, embed, self.domain if embed else None)
            if which == "primary":
                cut = model.take_truncated() if isinstance(model, EmbeddingClassifier) else 0
                refined = model.take_refined() if isinstance(model, RefinedClassifier) else 0
        except Exception as exc:  # every caller in this batch gets the error; the scorer goes on
            outcome, took_s = exc, 0.0
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits for these answers
            live[0][1].get_loop().call_soon_threadsafe(self._answer, live, unique, which, outcome, took_s, cut,
                                                       refined)

    def _answer(self, live: list[_Item], unique: list[_Key], which: str, outcome: BatchScores | Exception,
                took_s: float, cut: int, refined: int) -> None:
        """On the event loop: a scored batch's counts and caches, then its callers' answers."""
        self.batch_sizes.append(len(unique))
        if self.on_batch is not None:
            self.on_batch(len(unique))
        if isinstance(outcome, Exception):
            for _, fut, _ in live:
                if not fut.done():
                    fut.set_exception(outcome)
            return
        self.scored_by[which] += len(unique)
        if self.on_scored is not None:
            self.on_scored(which, len(unique))
        if which == "primary":
            per_text = took_s / len(unique)
            self._primary_s_per_text += _EWMA * (per_text - self._primary_s_per_text) \
                if self._primary_s_per_text else per_text
            self._keep(unique, outcome)
            self._count("tokens", cut)
            self.refined += refined
        by_key = dict(zip(unique, outcome.scores, strict=True))
        for key, fut, _ in live:
            if not fut.done():
                fut.set_result((by_key[key], which))

    def _keep(self, keys: list[_Key], scored: BatchScores) -> None:
        """A primary batch's scores, and what was computed beside them, into the caches."""
        for key, value in zip(keys, scored.scores, strict=True):
            self.cache.put(key, value)
        if scored.vectors is not None:  # an embedding depends on the text alone
            for (text, _), vector in zip(keys, scored.vectors, strict=True):
                self._vectors.put(text, vector)
        if scored.structure is not None:  # the structural columns on the text and its conversation's shape
            for key, row in zip(keys, scored.structure, strict=True):
                self._structure.put(key, row)
        if scored.figures is not None:
            for (text, _), figure in zip(keys, scored.figures, strict=True):
                self._figures.put(text, figure)

    @property
    def overflow_state(self) -> str:
        """"ready" (attached), "loading" (its thread runs), "failed" (the thread ended without one: logged), or
        "none" (no overflow model asked for)."""
        if self.overflow is not None:
            return "ready"
        if self.overflow_loader is None:
            return "none"
        return "loading" if self.overflow_loader.is_alive() else "failed"

    def load_overflow_in_background(self, load: Callable[[], BatchModel], what: str) -> threading.Thread:
        """Build the overflow model on a low-priority daemon thread (its first load may build a cache for a
        minute) and attach it when ready; until then, or if loading fails (logged), the primary scores all."""
        def run() -> None:
            with contextlib.suppress(OSError):  # nice 19 for this thread only: it uses the cores the gateway idles
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
            started = time.monotonic()
            try:
                model = load()
            except Exception as exc:  # the gateway serves on with the primary alone
                _log.warning("router overflow model %s not loaded (%s); the primary model scores every request",
                             what, exc)
                return
            if not self._closed:
                self.overflow = model
                _log.info("router overflow model %s ready after %.1f s: batches the primary would answer later "
                          "than %.0f ms go to it", what, time.monotonic() - started, self._config.overflow_after_ms)

        thread = threading.Thread(target=run, name="router-overflow-load", daemon=True)
        thread.start()
        self.overflow_loader = thread
        return thread

    async def aclose(self) -> None:
        """Stop the worker threads (after their batch in flight), fail queued and in-flight calls. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._threads.close()
        for fut in list(self._waiting):
            if not fut.done():
                fut.set_exception(RuntimeError("scorer closed"))
        self._waiting.clear()
        await asyncio.to_thread(self._threads.join)


def set_torch_threads(threads: int) -> None:
    """Pin torch's intra-op threads (the embedder's matmuls). Process-wide.

    Measured with loadtest/bench/scorer.py on the shared 2-core machine: 2 threads sustained ~169 scored/s
    (p99 109 ms at 100 req/s offered) against ~148/s (p99 255 ms) with 1 thread, so 2 is the default.
    """
    import torch

    torch.set_num_threads(threads)


def load_model(
    artifact_path: str | None = None, torch_threads: int | None = 2, embedder_name: str | None = None,
    refine: str | None = None,
) -> EmbeddingClassifier:
    """Load and verify the artifact (default: the shipped one) and its embedder, warmed up. Takes seconds.

    `torch_threads`: intra-op threads of the embedder (torch's process-wide pool, or the ONNX Runtime
    session's). `embedder_name` overrides the artifact's embedder (benchmarks only: the caller vouches that
    its vectors are equivalent). `refine` ("auto", "none" or a path: `refined_model.refine_front`; None:
    `$CASCADE_ROUTER_REFINE`, else "none"): with "auto" the shipped default is served behind the fast artifact,
    which scores every text, and re-scores only the texts near the thresholds in use (`RefinedClassifier`).
    Raises `ArtifactError` for a missing, corrupt or incompatible artifact.
    """
    front = refine_front(artifact_path, refine or refine_choice()) if embedder_name is None else None
    model = _load_one(artifact_path, torch_threads, embedder_name)
    if front is None:
        return model
    refined = RefinedClassifier(_load_one(str(front), torch_threads, None), model, SHIPPED_BAND, model.version)
    refined(["warm-up"])
    return refined


def _load_one(artifact_path: str | None, torch_threads: int | None, embedder_name: str | None) -> EmbeddingClassifier:
    """One artifact and its embedder (`load_model`, without a front), warmed up."""
    path = Path(artifact_path) if artifact_path else current_artifact_path()
    art = load_artifact(path)
    name = embedder_name or art.embedder
    if torch_threads is not None and any(parse_name(p).backend == "torch" for p in part_names(name)):
        set_torch_threads(torch_threads)
    embedder = make_embedder(name, threads=torch_threads)
    if art.router.dim != embedder.dim + len(FEATURE_NAMES):
        raise ArtifactError(
            f"router artifact expects {art.router.dim} features but {embedder.name} gives "
            f"{embedder.dim} + {len(FEATURE_NAMES)}; retrain with `cascade router train`"
        )
    model = EmbeddingClassifier(embedder, art.router, artifact_version(path, art.metadata))
    model(["warm-up"])  # the first call pays one-off allocation costs
    return model


def _domain(artifact_path: str | Path, embedder: str) -> DomainReference | None:
    """The artifact's domain reference (`domain_file.reference_for`); None when it has none or it cannot be served
    (logged: the router serves on, its requests without an in-domain figure)."""
    from router_models.serving.domain_file import reference_for

    try:
        found = reference_for(artifact_path, embedder)
    except ArtifactError as exc:
        _log.warning("router domain reference not loaded (%s); requests get no in-domain figure", exc)
        return None
    if found is None:
        _log.info("router artifact %s has no domain reference; requests get no in-domain figure", artifact_path)
        return None
    return found[0]


def load_scorer(
    artifact_path: str | None = None, config: BatchingConfig | None = None, torch_threads: int | None = 1,
    overflow: str = "none",
) -> ClassifierScorer:
    """The gateway's scorer: `load_model` behind a micro-batcher and cache. Takes seconds: call it at
    start-up (the gateway's lifespan), never at import time. Raises `ArtifactError` for a missing, corrupt
    or incompatible artifact. The caller owns the scorer and must `await scorer.aclose()`.

    Parallelism comes from `config.workers` concurrent calls, each on `torch_threads` intra-op threads (one
    by default: on small batches a second intra-op thread mostly adds wake-up costs, see BENCHMARKS.md).
    `overflow` ("none", "auto" or an artifact path, see `artifact.overflow_artifact`) is verified now and its
    model loaded in the background (`ClassifierScorer.load_overflow_in_background`), unless it is the primary's own
    front (the shipped default's: `refined_model`), which serves as the overflow model from the start. BLAS runs on
    one thread in this process from then on (`blas_threads`: its per-request products are small) unless the
    environment sets a count, and `tokenizers` encodes batches on the scorer's own threads (`serial_tokenizers`)."""
    overflow_path = overflow_artifact(artifact_path, overflow)
    scoring_threads()
    model = load_model(artifact_path, torch_threads)
    rows_from = str(rows_artifact(artifact_path))  # load_model checked the front; its rows name the reference
    scorer = ClassifierScorer(model, config, version=model.version, domain=_domain(rows_from, model.embedder_name))
    scorer.pool_map = pool_map_for(model.embedder_name)  # None without one on this embedder (logged)
    if overflow_path is None:
        return scorer
    fast = model.fast if isinstance(model, RefinedClassifier) else None
    if fast is not None and Path(rows_from).resolve() == overflow_path.resolve():  # a front's rows are its own
        # the shipped default's overflow is its own front (the fast artifact): served by the front's embedder and
        # router, loaded once (its word-piece table is 47 MB), so the overflow is ready at start
        scorer.overflow = fast
    else:
        scorer.load_overflow_in_background(lambda: load_model(str(overflow_path), 1), str(overflow_path))
    return scorer
