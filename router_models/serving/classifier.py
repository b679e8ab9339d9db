"""The complexity classifier head: embedding + structural features -> P(micro pool falls short).

A standardised logistic regression folded into one weight vector, so serving needs only numpy (no pickle,
no scikit-learn at request time) and the artifact stays a few kilobytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from router_models.embedders.features import structural_features
from router_models.serving.scorer import ConversationShape

__all__ = ["LinearRouter", "feature_matrix"]

FloatArray = npt.NDArray[np.float32]


def feature_matrix(embeddings: FloatArray, texts: Sequence[str],
                   shapes: Sequence[ConversationShape | None] | None = None) -> FloatArray:
    """The classifier's input: embeddings (n, dim) beside the structural features of the same texts and their
    conversations' shapes (None: plain prompts)."""
    if len(texts) != embeddings.shape[0]:
        raise ValueError(f"{len(texts)} texts but {embeddings.shape[0]} embeddings")
    return np.hstack([embeddings.astype(np.float32), structural_features(texts, shapes)])


@dataclass(frozen=True)
class LinearRouter:
    """score = sigmoid(weights . x + bias) on raw (unstandardised) feature rows x.

    `weights` already include the training-time standardisation; `dim` is the feature width it expects.
    """

    weights: FloatArray
    bias: float

    @property
    def dim(self) -> int:
        return int(self.weights.shape[0])

    def predict_proba(self, features: FloatArray) -> npt.NDArray[np.float64]:
        """One probability in [0, 1] per row of `features` (shape (n, dim))."""
        if features.ndim != 2 or features.shape[1] != self.dim:
            raise ValueError(f"expected (n, {self.dim}) features, got {features.shape}")
        z = features.astype(np.float64) @ self.weights.astype(np.float64) + self.bias
        return 1.0 / (1.0 + np.exp(-np.clip(z, -40.0, 40.0)))
