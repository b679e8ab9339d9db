"""The models a `ClassifierScorer` batches: the protocols (`BatchModel`, `EmbeddingModel`, `FeatureModel`), the trained
classifier over an embedder (`EmbeddingClassifier`), and one batch's scoring (`score_texts`: the scores, the vectors
and structural columns they came from, and their in-domain figures). Synchronous, CPU-bound: run in the scorer's
worker threads. Re-exported by `classifier_scorer`, where they were first."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np

from router_models.embedders.protocol import Embedder, FloatArray
from router_models.serving.classifier import LinearRouter, feature_matrix
from router_models.serving.domain import DomainReference
from router_models.serving.scorer import ConversationShape

__all__ = ["BatchModel", "BatchScores", "EmbeddingClassifier", "EmbeddingModel", "FeatureModel", "score_texts"]

class BatchModel(Protocol):
    """Synchronous, CPU-bound: scores a batch of conversations, texts[i] of shape shapes[i], one float in [0, 1]
    per text, in order. Without `shapes`, every text is a plain prompt (`scorer.prompt_shape`)."""

    def __call__(self, texts: Sequence[str], shapes: Sequence[ConversationShape] | None = None) -> list[float]: ...


@runtime_checkable
class EmbeddingModel(BatchModel, Protocol):
    """A `BatchModel` that also hands out the embeddings it scored from, row i for texts[i], in the vector space
    named `embedder_name` (the response cache's semantic mode compares them: `gateway.caching`)."""

    embedder_name: str

    def score_and_embed(self, texts: Sequence[str], shapes: Sequence[ConversationShape] | None = None
                        ) -> tuple[list[float], FloatArray]: ...


@runtime_checkable
class FeatureModel(EmbeddingModel, Protocol):
    """An `EmbeddingModel` that also hands out the structural columns it scored from (`classifier.feature_matrix`'s
    columns after the embedding), row i for texts[i] and shapes[i]: label memories whose similarity reads them
    (`label_memory.MemoryParams.structure`) take them from the scorer instead of computing them again."""

    def score_and_features(self, texts: Sequence[str], shapes: Sequence[ConversationShape] | None = None
                           ) -> tuple[list[float], FloatArray, FloatArray]: ...


class EmbeddingClassifier:
    """`BatchModel` of an embedder and a trained `LinearRouter`. Thread-safe when its embedder is."""

    def __init__(self, embedder: Embedder, router: LinearRouter, version: str = "") -> None:
        self._embedder = embedder
        self._router = router
        self.version = version  # the artifact's (`artifact.artifact_version`)

    @property
    def embedder_name(self) -> str:
        return self._embedder.name

    @property
    def embedder(self) -> Embedder:
        return self._embedder

    @property
    def router(self) -> LinearRouter:
        """The trained head (label memories take their residuals against it)."""
        return self._router

    def __call__(self, texts: Sequence[str], shapes: Sequence[ConversationShape] | None = None) -> list[float]:
        return self.score_and_embed(texts, shapes)[0]

    def score_and_embed(self, texts: Sequence[str], shapes: Sequence[ConversationShape] | None = None
                        ) -> tuple[list[float], FloatArray]:
        """The scores and the embeddings of the texts they came from (one model call for both)."""
        scores, vectors, _ = self.score_and_features(texts, shapes)
        return scores, vectors

    def score_and_features(self, texts: Sequence[str], shapes: Sequence[ConversationShape] | None = None
                           ) -> tuple[list[float], FloatArray, FloatArray]:
        """The scores, the embeddings and the structural columns they came from (one model call for all three)."""
        vectors = self._embedder.embed(texts)
        feats = feature_matrix(vectors, texts, shapes)
        structure = np.ascontiguousarray(feats[:, vectors.shape[1]:])
        return [float(p) for p in self._router.predict_proba(feats)], vectors, structure

    def score_structured(self, texts: Sequence[str], structure: FloatArray) -> list[float]:
        """The scores of texts whose structural columns are already computed (row i for texts[i], as
        `score_and_features` gives them, on the same shapes): this embedder's vectors beside them, one call."""
        rows = np.hstack([self._embedder.embed(texts), np.asarray(structure, np.float32)])
        return [float(p) for p in self._router.predict_proba(rows)]

    def take_truncated(self) -> int:
        """Texts whose word pieces the embedder cut (at its token limit, as in training) since the last call;
        0 for an embedder that does not count them."""
        take = getattr(self._embedder, "take_truncated", None)
        return int(take()) if take is not None else 0


class BatchScores(NamedTuple):
    """What `score_texts` gives for a batch: the scores, in order, and when asked and the model gives them, the
    embeddings they came from, the structural columns beside them (`FeatureModel`) and the in-domain figures."""

    scores: list[float]
    vectors: FloatArray | None = None
    structure: FloatArray | None = None
    figures: list[float] | None = None


def score_texts(model: BatchModel, texts: list[str], shapes: list[ConversationShape], embed: bool,
                domain: DomainReference | None = None) -> BatchScores:
    """The scores, with the embeddings and structural columns when `embed` and the model gives them, and their
    in-domain figures when `domain` is given too (to 4 decimals, as headers, records and `cascade router score`
    show them)."""
    structure: FloatArray | None = None
    # the concrete class first: an isinstance against a runtime-checkable protocol walks its members each call
    # (20-24 us each on Python 3.11, two of them a batch: ~10% of a lone prompt's CPU on the static embedder)
    if embed and isinstance(model, (EmbeddingClassifier, FeatureModel)):  # in that order: the first match answers
        values, vectors, structure = model.score_and_features(texts, shapes)
    elif embed and isinstance(model, EmbeddingModel):
        values, vectors = model.score_and_embed(texts, shapes)
    else:
        return BatchScores(model(texts, shapes))
    figures = None if domain is None else [round(float(v), 4) for v in domain.in_domain(vectors)]
    return BatchScores(values, vectors, structure, figures)
