"""The scorer keeps the embeddings its primary model scored from, for the response cache's semantic mode: the
vector of a text it scored, the same one when the score came from its cache, none for what it did not score or
what the overflow model scored (another vector space), and none from a model without embeddings."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from router_models.serving.classifier_scorer import BatchingConfig, ClassifierScorer, EmbeddingModel
from router_models.serving.scorer import ConversationShape, EmbeddingSource


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
