"""The scorer keeps the embeddings its primary model scored from, for the response cache's semantic mode: the
vector of a text it scored, the same one when the score came from its cache, none for what it did not score or
what the overflow model scored (another vector space), and none from a model without embeddings. A model that
also gives its structural columns has them kept per conversation (text and shape), for label memories."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from router_models.serving.classifier_scorer import BatchingConfig, ClassifierScorer, EmbeddingModel, FeatureModel
from router_models.serving.scorer import (
    ConversationShape,
    EmbeddingSource,
    FeatureSource,
    LengthScorer,
    ScorerViews,
    prompt_shape,
)


class EmbeddingFake:
    """`EmbeddingModel`: the vector of a text is [len(text), 1, 0, ...]; counts its calls."""

    embedder_name = "all-MiniLM-L6-v2:onnx-int8:t64:l3"

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, texts: Sequence[str], shapes: Sequence[ConversationShape] | None = None) -> list[float]:
        return self.score_and_embed(texts)[0]

    def score_and_embed(self, texts: Sequence[str], shapes: Sequence[ConversationShape] | None = None
                        ) -> tuple[list[float], npt.NDArray[np.float32]]:
        self.calls += 1
        vectors = np.zeros((len(texts), 8), dtype=np.float32)
        vectors[:, 0] = [len(t) for t in texts]
        vectors[:, 1] = 1
        return [0.5] * len(texts), vectors


class FeatureFake(EmbeddingFake):
    """`FeatureModel`: as `EmbeddingFake`, and the structural columns of a text are [user turns, total chars]
    of its shape (a plain prompt when none is given), so two shapes of one text differ."""

    def score_and_features(self, texts: Sequence[str], shapes: Sequence[ConversationShape] | None = None
                           ) -> tuple[list[float], npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        scores, vectors = self.score_and_embed(texts, shapes)
        read = shapes if shapes is not None else [prompt_shape(t) for t in texts]
        return scores, vectors, np.asarray([[s.user_turns, s.total_chars] for s in read], np.float32)


class ScoresOnly:
    def __call__(self, texts: Sequence[str], shapes: Sequence[ConversationShape] | None = None) -> list[float]:
        return [0.5] * len(texts)


async def test_the_primary_models_vectors_are_kept_beside_its_scores() -> None:
    model = EmbeddingFake()
    assert isinstance(model, EmbeddingModel)
    scorer = ClassifierScorer(model, BatchingConfig())
    assert isinstance(scorer, EmbeddingSource) and scorer.embedding_space == model.embedder_name
    assert scorer.embedding("hello") is None  # not scored yet
    assert await scorer.score_one("hello") == (0.5, "primary")
    vector = scorer.embedding("hello")
    assert vector is not None and vector[0] == 5 and vector[1] == 1
    assert await scorer.score_one("hello") == (0.5, "primary") and model.calls == 1  # from the cache
    assert scorer.embedding("hello") is vector
    assert scorer.embedding("other") is None
    await scorer.aclose()


async def test_overflow_scores_and_plain_models_keep_no_vectors() -> None:
    scorer = ClassifierScorer(EmbeddingFake(), BatchingConfig(overflow_after_ms=0.0), overflow=ScoresOnly())
    scorer._primary_s_per_text = 1.0  # every batch of two or more would be late: the overflow model scores it
    scores = await scorer.score(["first text", "second text"])
    assert scores == [0.5, 0.5] and scorer.scored_by["overflow"] == 2
    assert scorer.embedding("first text") is None
    await scorer.aclose()
    plain = ClassifierScorer(ScoresOnly(), BatchingConfig())
    assert plain.embedding_space == ""
    await plain.score_one("text")
    assert plain.embedding("text") is None
    await plain.aclose()


async def test_a_feature_model_has_each_conversations_whole_row_kept() -> None:
    model = FeatureFake()
    assert isinstance(model, FeatureModel)
    scorer = ClassifierScorer(model, BatchingConfig())
    assert isinstance(scorer, FeatureSource) and scorer.keeps_features
    assert scorer.features("hello") is None  # not scored yet
    chat = ConversationShape(user_turns=3, assistant_turns=2, total_chars=900, latest_chars=5)
    await scorer.score_one("hello")
    await scorer.score_one("hello", chat)
    plain, long = scorer.features("hello"), scorer.features("hello", chat)
    assert plain is not None and long is not None and plain.dtype == np.float32
    assert plain.tolist() == [5, 1, 0, 0, 0, 0, 0, 0, 1, 5] and long.tolist() == [5, 1, 0, 0, 0, 0, 0, 0, 3, 900]
    assert model.calls == 2
    await scorer.score_one("hello", chat)  # from the cache: the row stays as it was
    again = scorer.features("hello", chat)
    assert model.calls == 2 and again is not None and np.array_equal(again, long)
    other = ConversationShape(user_turns=2, assistant_turns=1, total_chars=400, latest_chars=5)
    assert scorer.features("hello", other) is None  # this text never scored in that conversation
    await scorer.aclose()


async def test_only_a_feature_model_scored_by_the_primary_keeps_rows() -> None:
    embeddings_only = ClassifierScorer(EmbeddingFake(), BatchingConfig())
    assert not embeddings_only.keeps_features
    await embeddings_only.score_one("hello")
    assert embeddings_only.embedding("hello") is not None and embeddings_only.features("hello") is None
    await embeddings_only.aclose()
    surged = ClassifierScorer(FeatureFake(), BatchingConfig(overflow_after_ms=0.0), overflow=ScoresOnly())
    surged._primary_s_per_text = 1.0  # the batch of two goes to the overflow model: another vector space
    await surged.score(["first text", "second text"])
    assert surged.scored_by["overflow"] == 2 and surged.features("first text") is None
    await surged.aclose()


async def test_scorer_views_name_each_protocol_a_scorer_satisfies() -> None:
    classifier = ClassifierScorer(FeatureFake(), BatchingConfig())
    views = ScorerViews.of(classifier)
    assert views.scorer is classifier and views.embedding is classifier and views.features is classifier
    length = LengthScorer()
    assert ScorerViews.of(length) == ScorerViews(length, None, None, None)
    assert ScorerViews.of(None) == ScorerViews(None, None, None, None)
    await classifier.aclose()
