"""The complexity classifier head: embedding + structural features -> P(micro pool falls short).

A standardised logistic regression folded into one weight vector, so serving needs only numpy (no pickle,
no scikit-learn at request time) and the artifact stays a few kilobytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from router_models.embedders.features import structural_features
from router_models.serving.scorer import ConversationShape

__all__ = ["LinearRouter", "SourceRouters", "feature_matrix"]

FloatArray = npt.NDArray[np.float32]


def feature_matrix(embeddings: FloatArray, texts: Sequence[str],
                   shapes: Sequence[ConversationShape | None] | None = None) -> FloatArray:
    """The classifier's input: embeddings (n, dim) beside the structural features of the same texts and their
    conversations' shapes (None: plain prompts)."""
    if len(texts) != embeddings.shape[0]:
        raise ValueError(f"{len(texts)} texts but {embeddings.shape[0]} embeddings")
    return np.hstack([embeddings.astype(np.float32), structural_features(texts, shapes)])


@dataclass(frozen=True)
class SourceRouters:
    """One linear router per public source the artifact was trained on, each fitted on that source alone (`names`;
    `weights` (k, dim) float32, `biases` (k,)): the directions along which the sources' routers disagree, which a
    label memory combines to read a user's traffic (`label_memory`). Not used to score on their own."""

    names: tuple[str, ...]
    weights: FloatArray
    biases: npt.NDArray[np.float64]

    def __post_init__(self) -> None:
        k = len(self.names)
        if self.weights.ndim != 2 or self.weights.shape[0] != k or self.biases.shape != (k,):
            raise ValueError(f"{len(self.names)} source routers with weights {self.weights.shape} and biases "
                             f"{self.biases.shape}")
        if not (np.all(np.isfinite(self.weights)) and np.all(np.isfinite(self.biases))):
            raise ValueError("source routers must be finite")

    def logits(self, features: npt.NDArray[np.floating]) -> npt.NDArray[np.float64]:
        """(n, k): each source router's logit for each row of `features` (n, dim)."""
        return np.asarray(np.asarray(features, np.float64) @ self.weights.T.astype(np.float64) + self.biases,
                          np.float64)


@dataclass(frozen=True)
class LinearRouter:
    """score = sigmoid(weights . x + bias) on raw (unstandardised) feature rows x.

    `weights` already include the training-time standardisation; `dim` is the feature width it expects.
    `sources`: the per-source routers the artifact carries beside it (None: an artifact without them); they do not
    change `predict_proba`.
    """

    weights: FloatArray
    bias: float
    sources: SourceRouters | None = field(default=None, repr=False, compare=False)

    @property
    def dim(self) -> int:
        return int(self.weights.shape[0])

    def predict_proba(self, features: FloatArray) -> npt.NDArray[np.float64]:
        """One probability in [0, 1] per row of `features` (shape (n, dim))."""
        if features.ndim != 2 or features.shape[1] != self.dim:
            raise ValueError(f"expected (n, {self.dim}) features, got {features.shape}")
        z = features.astype(np.float64) @ self.weights.astype(np.float64) + self.bias
        return 1.0 / (1.0 + np.exp(-np.clip(z, -40.0, 40.0)))
