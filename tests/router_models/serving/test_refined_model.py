"""The two-stage classifier: the fast router scores every text, the refiner re-scores only those inside the band, on
its own vectors beside the fast router's structural columns, and every row handed out is the fast router's."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from router_models.embedders.features import FEATURE_NAMES
from router_models.serving.artifact import DEFAULT_ARTIFACT, FAST_ARTIFACT
from router_models.serving.batch_model import EmbeddingClassifier, score_texts
from router_models.serving.classifier import LinearRouter, feature_matrix
from router_models.serving.classifier_scorer import BatchingConfig, ClassifierScorer, load_model
from router_models.serving.refined_model import RefineBand, RefinedClassifier, refine_front
from router_models.serving.scorer import prompt_shape

DIM = 4


class Embedder:
    """Row i: `value` in the first column, the text's length / 100 in the second; records what it embedded."""

    def __init__(self, name: str, value: float) -> None:
        self.name, self.dim, self.value = name, DIM, value
        self.seen: list[str] = []

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.seen.extend(texts)
        out = np.zeros((len(texts), DIM), dtype=np.float32)
        out[:, 0] = self.value
        out[:, 1] = [len(t) / 100 for t in texts]
        return out


def _router(weight_on_length: float, bias: float) -> LinearRouter:
    """A router whose logit is `weight_on_length` x the second embedding column + `bias` + 0.01 x the structure."""
    weights = np.zeros(DIM + len(FEATURE_NAMES), dtype=np.float32)
    weights[1] = weight_on_length
    weights[DIM:] = 0.01
    return LinearRouter(weights, bias)


def _models(band: RefineBand) -> tuple[RefinedClassifier, Embedder, Embedder, EmbeddingClassifier]:
    fast_embedder, slow_embedder = Embedder("fast", 0.5), Embedder("slow", -0.5)
    fast = EmbeddingClassifier(fast_embedder, _router(10.0, -3.0), "fast@1")
    refiner = EmbeddingClassifier(slow_embedder, _router(-10.0, 1.0), "slow@1")
    return RefinedClassifier(fast, refiner, band), fast_embedder, slow_embedder, refiner


def test_only_texts_inside_the_band_are_refined_and_their_rows_stay_the_fast_routers() -> None:
    texts = ["x" * 5, "x" * 30, "x" * 60]  # fast scores ~0.08, ~0.5, ~0.95: only the middle one is near
    model, fast_embedder, slow_embedder, refiner = _models(RefineBand((0.5,), 0.2))
    fast_scores = [float(p) for p in model.router.predict_proba(
        feature_matrix(fast_embedder.embed(texts), texts))]
    fast_embedder.seen.clear()
    assert fast_scores[0] < 0.3 < fast_scores[1] < 0.7 < fast_scores[2]
    scores, vectors, structure = model.score_and_features(texts)
    assert slow_embedder.seen == [texts[1]]  # the refiner embedded the near text alone
    assert scores[0] == pytest.approx(fast_scores[0]) and scores[2] == pytest.approx(fast_scores[2])
    slow_row = feature_matrix(Embedder("slow", -0.5).embed([texts[1]]), [texts[1]])
    assert scores[1] == pytest.approx(float(refiner.router.predict_proba(slow_row)[0]))
    assert scores[1] != pytest.approx(fast_scores[1])
    np.testing.assert_array_equal(vectors, fast_embedder.embed(texts))  # the fast router's space for every text
    np.testing.assert_array_equal(structure, feature_matrix(vectors, texts)[:, DIM:])
    assert model.take_refined() == 1 and model.take_refined() == 0
    assert model.embedder_name == "fast" and model.version == "fast@1"


def test_a_texts_score_does_not_depend_on_its_batch() -> None:
    texts = [f"prompt {'y' * k}" for k in range(0, 70, 7)]
    model = _models(RefineBand((0.5,), 0.3))[0]
    together = model(texts)
    alone = [model([t])[0] for t in texts]
    assert together == pytest.approx(alone, abs=1e-12)
    assert 0 < model.take_refined() < 2 * len(texts)  # some texts refined, not all


def test_the_scorer_batch_gives_the_refined_scores_with_the_fast_rows() -> None:
    texts = ["a" * 5, "a" * 30]
    model = _models(RefineBand((0.5,), 0.2))[0]
    batch = score_texts(model, texts, [prompt_shape(t) for t in texts], embed=True)
    assert batch.scores == pytest.approx(model(texts))
    assert batch.vectors is not None and batch.structure is not None
    assert batch.vectors.shape == (2, DIM) and batch.structure.shape == (2, len(FEATURE_NAMES))


def test_an_empty_band_is_the_fast_router_and_a_full_one_the_refiner() -> None:
    texts = [f"{'z' * k}" for k in (3, 25, 40, 80)]
    model, _, slow_embedder, refiner = _models(RefineBand((0.5,), 0.0))
    assert model(texts) == pytest.approx(EmbeddingClassifier(model.embedder, model.router)(texts))
    assert not slow_embedder.seen
    everything = _models(RefineBand((0.5,), 0.5))[0]
    assert everything(texts) == pytest.approx(refiner(texts))


def test_the_band_follows_the_thresholds_in_use() -> None:
    texts = ["b" * 5, "b" * 30, "b" * 60]  # fast scores ~0.08, ~0.5, ~0.95
    model, _, slow_embedder, _ = _models(RefineBand((0.5,), 0.1))
    assert model.refine_near(0.5) is False  # already there: nothing moved
    assert model.refine_near(0.95) is True and model.band == RefineBand((0.95,), 0.1)
    model(texts)
    assert slow_embedder.seen == [texts[2]]
    assert model.refine_near(0.08, 0.95) is True
    model(texts)
    assert slow_embedder.seen == [texts[2], texts[0], texts[2]]


async def test_the_scorer_drops_its_cached_scores_when_the_band_moves() -> None:
    """A score cached while the band sat on it is the refiner's; once the band moves away the text is scored
    again (the fast router's score), and a drift within a quarter of the half width keeps the cache."""
    text = "c" * 30  # fast score ~0.5: refined only while the band is centred there
    model, _, slow_embedder, _ = _models(RefineBand((0.5,), 0.1))
    fast_only = EmbeddingClassifier(model.embedder, model.router)([text])[0]
    scorer = ClassifierScorer(model, BatchingConfig(max_wait_ms=0))
    try:
        refined = (await scorer.score([text]))[0]
        assert refined != pytest.approx(fast_only) and slow_embedder.seen == [text]
        scorer.refine_near(0.52)
        assert await scorer.score([text]) == [refined] and scorer.cache.hits == 1  # kept: nothing re-scored
        scorer.refine_near(0.95)
        assert await scorer.score([text]) == pytest.approx([fast_only])
        assert slow_embedder.seen == [text] and scorer.cache.hits == 1  # scored again, by the fast router alone
    finally:
        await scorer.aclose()


@pytest.mark.parametrize(("centres", "half_width"), [((-0.1,), 0.1), ((0.5,), 1.5), ((0.2, 1.2), 0.1)])
def test_a_band_outside_the_score_scale_is_refused(centres: tuple[float, ...], half_width: float) -> None:
    with pytest.raises(ValueError, match="refine band"):
        RefineBand(centres, half_width)


def test_refine_front_puts_the_fast_artifact_in_front_of_the_shipped_default_only() -> None:
    assert refine_front(DEFAULT_ARTIFACT, "auto") == FAST_ARTIFACT
    assert refine_front(None, "auto") in (FAST_ARTIFACT, None)  # the current artifact: shipped, or one promoted
    assert refine_front(FAST_ARTIFACT, "auto") is None and refine_front(DEFAULT_ARTIFACT, "none") is None
    assert refine_front(DEFAULT_ARTIFACT, str(FAST_ARTIFACT)) == FAST_ARTIFACT


def test_the_shipped_default_in_two_stages_scores_as_its_two_artifacts_do() -> None:
    texts = ["hi", "What is 2 + 2?", "Prove that there are infinitely many primes, with every step justified.",
             "Write a Python function that merges two sorted lists in linear time.",
             "Translate 'good morning' to French.",
             "Summarise the causes of the First World War in three paragraphs, citing the main treaties."]
    fast = load_model(str(FAST_ARTIFACT), 1)
    slow = load_model(str(DEFAULT_ARTIFACT), 1, refine="none")
    model = load_model(str(DEFAULT_ARTIFACT), 1, refine="auto")
    assert isinstance(model, RefinedClassifier) and model.embedder_name == fast.embedder_name
    assert model.version == slow.version  # records keep naming the shipped default
    fast_scores, slow_scores = fast(texts), slow(texts)
    centre = sorted(fast_scores)[len(texts) // 2]  # a threshold in use that at least one text is near
    model.refine_near(centre)
    model.take_refined()
    want = [b if abs(a - centre) < model.band.half_width else a for a, b in zip(fast_scores, slow_scores, strict=True)]
    assert model(texts) == pytest.approx(want, abs=1e-6)
    assert model.take_refined() == sum(abs(a - centre) < model.band.half_width for a in fast_scores) >= 1
