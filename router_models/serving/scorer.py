"""The scoring contract: a conversation's text and shape in, P(micro pool's answer falls short) out.

The gateway depends only on `Scorer`, `conversation_text` and `conversation_shape`; the trained classifier, its
micro-batcher and the stand-in below all satisfy the same protocol.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from router_models.embedders.conversation import (
    SCORING_CHARS,
    ConversationShape,
    conversation_shape,
    conversation_text,
    prompt_shape,
    read_conversation,
)

__all__ = ["SCORING_CHARS", "ConversationShape", "DomainSource", "EmbeddingSource", "FeatureSource", "LengthScorer",
           "Refinable", "Scorer", "ScorerViews", "conversation_shape", "conversation_text", "prompt_shape",
           "read_conversation"]


class Scorer(Protocol):
    """Scores texts in one batch. Returns one float in [0, 1] per text, in input order. `score` reads each text as
    a plain prompt (one user turn); `score_one` also takes the conversation's shape.

    Implementations run CPU work off the event loop (a worker thread) and may batch concurrent callers.
    `version` names what scores: the trained artifact's version (`artifact.artifact_version`), or the
    scorer's own name.
    """

    version: str

    async def score(self, texts: Sequence[str]) -> list[float]: ...

    async def score_one(self, text: str, shape: ConversationShape | None = None) -> tuple[float, str]:
        """The score of one conversation (`conversation_text`, and its `conversation_shape`; None: `text` is a
        plain prompt, `prompt_shape(text)`) and the model that gave it: "primary" or "overflow" for the trained
        classifier (`router_models.serving.classifier_scorer`), the scorer's own name otherwise. The ledger keeps
        it, so a cost report can price the quality of what a surge sent to the cheaper model."""
        ...

    async def aclose(self) -> None: ...


@runtime_checkable
class EmbeddingSource(Protocol):
    """A scorer that keeps the embeddings it scored from (the trained classifier does): `embedding(text)` is the
    vector it computed for `text` when it scored it, or None; `embedding_space` names the vector space (the
    embedder), "" when it keeps none. Read from the event loop, never computes anything."""

    embedding_space: str

    def embedding(self, text: str) -> npt.NDArray[np.float32] | None: ...


@runtime_checkable
class FeatureSource(Protocol):
    """A scorer that keeps the whole feature row each conversation was scored from (the trained classifier does:
    its embedding, then the structural columns of its text and shape, `classifier.feature_matrix`):
    `features(text, shape)` is that row, or None (not scored by the primary model, expired or evicted; a None
    `shape` is a plain prompt). `keeps_features` says whether it keeps any. Read from the event loop, never
    computes anything the worker threads did not."""

    keeps_features: bool

    def features(self, text: str, shape: ConversationShape | None = None) -> npt.NDArray[np.float32] | None: ...


@runtime_checkable
class DomainSource(Protocol):
    """A scorer that keeps each scored text's in-domain figure (`router_models.serving.domain`; the trained
    classifier does, with a domain reference): `in_domain(text)` is the figure of the primary model's score of
    `text`, or None. Read from the event loop, never computes anything."""

    def in_domain(self, text: str) -> float | None: ...


@runtime_checkable
class Refinable(Protocol):
    """A scorer whose score is refined near the thresholds in use (the shipped default: `refined_model`): the router
    tells it, before scoring, the thresholds the request's decision will read (`refine_near`). Cheap, idempotent."""

    def refine_near(self, *thresholds: float) -> None: ...


@dataclass(frozen=True)
class ScorerViews:
    """`scorer` as each protocol above it satisfies (None where it does not), checked once per scorer and kept
    beside it: an `isinstance` against a runtime-checkable protocol walks the protocol's members each time (about
    6 us here), too much for every request."""

    scorer: Scorer | None
    embedding: EmbeddingSource | None
    features: FeatureSource | None
    domain: DomainSource | None
    refine: Refinable | None = None

    @classmethod
    def of(cls, scorer: Scorer | None) -> ScorerViews:
        return cls(scorer, scorer if isinstance(scorer, EmbeddingSource) else None,
                   scorer if isinstance(scorer, FeatureSource) else None,
                   scorer if isinstance(scorer, DomainSource) else None,
                   scorer if isinstance(scorer, Refinable) else None)


class LengthScorer:
    """Stand-in scorer for tests and for running without a trained artifact: longer prompts score higher.

    score = min(1, words / `saturation_words`). Cheap, deterministic, and honest about being a heuristic.
    """

    version = "length"

    def __init__(self, saturation_words: int = 200) -> None:
        self._saturation = float(saturation_words)

    async def score(self, texts: Sequence[str]) -> list[float]:
        return [min(1.0, len(t.split()) / self._saturation) for t in texts]

    async def score_one(self, text: str, shape: ConversationShape | None = None) -> tuple[float, str]:
        return (await self.score([text]))[0], "length"

    async def aclose(self) -> None:
        return None
