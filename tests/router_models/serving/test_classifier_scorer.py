"""The micro-batcher: concurrent calls share one model call, the loop never blocks, the cache answers."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

import pytest

from router_models.serving.classifier_scorer import BatchingConfig, ClassifierScorer
from router_models.serving.scorer import ConversationShape, prompt_shape


class FakeModel:
    """Score = len(text) / 100; sleeps `delay` seconds per call (like a CPU-bound embedder would)."""

    def __init__(self, delay: float = 0.0, fail: bool = False) -> None:
        self.delay = delay
        self.fail = fail
        self.calls: list[list[str]] = []
        self.threads: set[str] = set()

    def __call__(self, texts: Sequence[str], shapes: Sequence[ConversationShape] | None = None) -> list[float]:
        self.calls.append(list(texts))
        self.threads.add(threading.current_thread().name)
        time.sleep(self.delay)
        if self.fail:
            raise RuntimeError("model exploded")
        return [len(t) / 100 for t in texts]


async def test_concurrent_calls_share_one_batch() -> None:
    model = FakeModel()
    scorer = ClassifierScorer(model, BatchingConfig(max_wait_ms=20, max_batch=32))
    texts = [f"prompt {'x' * i}" for i in range(20)]
    results = await asyncio.gather(*(scorer.score([t]) for t in texts))
    assert [r[0] for r in results] == [len(t) / 100 for t in texts]
    assert len(model.calls) == 1
    assert sorted(model.calls[0]) == sorted(texts)
    assert list(scorer.batch_sizes) == [20]
    assert all(name.startswith("router-scorer") for name in model.threads)
    await scorer.aclose()


async def test_max_batch_splits_and_keeps_order() -> None:
    model = FakeModel()
    scorer = ClassifierScorer(model, BatchingConfig(max_wait_ms=20, max_batch=8))
    texts = [f"t{i:02d}" + "y" * i for i in range(20)]
    assert await scorer.score(texts) == [len(t) / 100 for t in texts]
    assert max(len(c) for c in model.calls) <= 8
    assert sum(len(c) for c in model.calls) == 20
    await scorer.aclose()


async def test_duplicates_in_a_batch_are_scored_once() -> None:
    model = FakeModel()
    scorer = ClassifierScorer(model, BatchingConfig(max_wait_ms=10))
    out = await asyncio.gather(scorer.score(["same", "other"]), scorer.score(["same"]))
    assert list(out) == [[0.04, 0.05], [0.04]]
    assert model.calls == [["same", "other"]]
    await scorer.aclose()


async def test_loop_never_blocks_while_model_runs() -> None:
    model = FakeModel(delay=0.3)
    scorer = ClassifierScorer(model, BatchingConfig(max_wait_ms=1))
    gaps: list[float] = []

    async def heartbeat() -> None:
        last = time.perf_counter()
        for _ in range(40):
            await asyncio.sleep(0.005)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    await asyncio.gather(scorer.score(["slow prompt"]), heartbeat())
    assert max(gaps) < 0.1  # the 0.3 s model call ran off the loop
    await scorer.aclose()


async def test_cache_hits_skip_the_model_and_expire() -> None:
    now = [0.0]
    model = FakeModel()
    scorer = ClassifierScorer(model, BatchingConfig(max_wait_ms=1, cache_ttl_s=10), clock=lambda: now[0])
    assert await scorer.score(["hello"]) == [0.05]
    assert await scorer.score(["hello", "hello"]) == [0.05, 0.05]
    assert len(model.calls) == 1
    assert scorer.cache.hits == 2
    now[0] = 11.0
    await scorer.score(["hello"])
    assert len(model.calls) == 2
    await scorer.aclose()


async def test_model_error_reaches_every_caller_and_scorer_survives() -> None:
    model = FakeModel(fail=True)
    scorer = ClassifierScorer(model, BatchingConfig(max_wait_ms=5))
    results = await asyncio.gather(scorer.score(["a"]), scorer.score(["b"]), return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in results)
    model.fail = False
    assert await scorer.score(["ok"]) == [0.02]
    await scorer.aclose()


async def test_cancelled_caller_does_not_break_the_batch() -> None:
    model = FakeModel(delay=0.05)
    scorer = ClassifierScorer(model, BatchingConfig(max_wait_ms=5))
    doomed = asyncio.create_task(scorer.score(["doomed"]))
    kept = asyncio.create_task(scorer.score(["kept"]))
    await asyncio.sleep(0)
    doomed.cancel()
    assert await kept == [0.04]
    await scorer.aclose()


async def test_callers_that_left_are_not_kept() -> None:
    """A caller cancelled before its batch is taken (a client that hung up) is skipped by the batch and dropped from
    the callers `aclose` would fail: a gateway whose clients leave does not collect their futures."""
    gate = threading.Event()

    class Held(FakeModel):
        def __call__(self, texts: Sequence[str], shapes: Sequence[ConversationShape] | None = None) -> list[float]:
            assert gate.wait(5.0)
            return super().__call__(texts, shapes)

    model = Held()
    scorer = ClassifierScorer(model, BatchingConfig(workers=1))
    first = asyncio.create_task(scorer.score_one("in flight"))
    await asyncio.sleep(0)  # queued: the one thread takes it and waits at the gate
    left = [asyncio.create_task(scorer.score_one(f"left {k}")) for k in range(3)]
    await asyncio.sleep(0)
    for task in left:
        task.cancel()
    await asyncio.sleep(0)  # the cancellations' callbacks
    assert len(scorer._waiting) == 1  # the one in flight
    gate.set()
    assert await first == (0.09, "primary")
    assert not scorer._waiting
    await scorer.aclose()
    assert model.calls == [["in flight"]]  # the batch of callers who left was skipped, not scored


async def test_aclose_is_idempotent_and_final() -> None:
    scorer = ClassifierScorer(FakeModel())
    await scorer.score(["x"])
    await scorer.aclose()
    await scorer.aclose()
    with pytest.raises(RuntimeError, match="closed"):
        await scorer.score(["y"])


class ConcurrencyProbe(FakeModel):
    """FakeModel that records how many calls ran at the same time."""

    def __init__(self, delay: float) -> None:
        super().__init__(delay)
        self._lock = threading.Lock()
        self.running = 0
        self.most = 0

    def __call__(self, texts: Sequence[str], shapes: Sequence[ConversationShape] | None = None) -> list[float]:
        with self._lock:
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            return super().__call__(texts)
        finally:
            with self._lock:
                self.running -= 1


@pytest.mark.parametrize("workers", [1, 2, 3])
async def test_workers_bound_the_model_calls_in_flight(workers: int) -> None:
    model = ConcurrencyProbe(delay=0.05)
    scorer = ClassifierScorer(model, BatchingConfig(max_batch=1, workers=workers))
    texts = [f"text {i}" for i in range(6)]
    assert await asyncio.gather(*(scorer.score([t]) for t in texts)) == [[len(t) / 100] for t in texts]
    assert model.most == workers
    assert len(model.threads) == workers
    await scorer.aclose()


async def test_without_a_window_a_lone_text_is_scored_at_once() -> None:
    model = FakeModel()
    scorer = ClassifierScorer(model, BatchingConfig(max_wait_ms=0))
    await scorer.score(["warm"])  # starts the workers
    start = time.perf_counter()
    assert await scorer.score(["now"]) == [0.03]
    assert time.perf_counter() - start < 0.05
    windowed = ClassifierScorer(FakeModel(), BatchingConfig(max_wait_ms=200))
    start = time.perf_counter()
    await windowed.score(["later"])
    assert time.perf_counter() - start >= 0.15  # the window is what delayed it
    await scorer.aclose()
    await windowed.aclose()


async def test_a_busy_worker_leaves_the_queue_to_form_the_next_batch() -> None:
    model = FakeModel(delay=0.1)
    scorer = ClassifierScorer(model, BatchingConfig(workers=1, max_batch=16))
    first = asyncio.create_task(scorer.score(["first"]))
    await asyncio.sleep(0.02)  # the worker is busy with "first"
    rest = await asyncio.gather(*(scorer.score([f"q{i}"]) for i in range(5)))
    assert await first == [0.05] and rest == [[0.02]] * 5
    assert model.calls == [["first"], [f"q{i}" for i in range(5)]]
    await scorer.aclose()


async def test_aclose_fails_the_batch_in_flight() -> None:
    scorer = ClassifierScorer(FakeModel(delay=0.2))
    call = asyncio.create_task(scorer.score(["slow"]))
    await asyncio.sleep(0.05)
    await scorer.aclose()
    with pytest.raises(RuntimeError, match="closed"):
        await asyncio.wait_for(call, 1.0)


def test_config_is_checked() -> None:
    with pytest.raises(ValueError, match="workers"):
        ClassifierScorer(FakeModel(), BatchingConfig(workers=0))


class ShapeModel(FakeModel):
    """Score = len(text) / 100 + user turns / 10: a model that reads the conversation's shape."""

    def __call__(self, texts: Sequence[str], shapes: Sequence[ConversationShape] | None = None) -> list[float]:
        assert shapes is not None and len(shapes) == len(texts)
        return [v + s.user_turns / 10 for v, s in zip(super().__call__(texts), shapes, strict=True)]


async def test_the_cache_keys_on_the_shape_too() -> None:
    model = ShapeModel()
    scorer = ClassifierScorer(model)
    long_chat = ConversationShape(user_turns=5, assistant_turns=4, total_chars=5000, latest_chars=4)
    assert await scorer.score_one("more") == pytest.approx((0.14, "primary"))
    assert await scorer.score_one("more", long_chat) == pytest.approx((0.54, "primary"))  # not the cached 0.14
    assert await scorer.score_one("more", prompt_shape("more")) == pytest.approx((0.14, "primary"))  # cached
    assert await scorer.score(["more"]) == [pytest.approx(0.14)]  # a text alone is a plain prompt
    assert model.calls == [["more"], ["more"]]
    await scorer.aclose()
