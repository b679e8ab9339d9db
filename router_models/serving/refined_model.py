"""A two-stage classifier: the fast router scores every text, the transformer router re-scores the texts whose fast
score falls inside a band (`RefineBand`), where the thresholds in use sit and a decision is close.

Contract:
- Every row the scorer hands out is the fast router's: the embedding (the response cache's semantic mode), the
  structural columns beside it (label memories, a pool map), the in-domain figure and the per-source routers a memory
  combines. One vector space for every request, whichever router gave its score, so a memory, a pool map and a
  domain reference built on the fast artifact's rows read every request alike. Only the score is refined.
- A text's score is a function of that text and its shape alone: the band is fixed when the model is built, both
  embedders give a text's vector independently of the texts batched with it, and the refiner reuses the fast
  router's structural columns (the same columns: both artifacts read `classifier.feature_matrix`).
- `refined` counts the texts the refiner scored (the scorer's metrics read it with `take_refined`).
Synchronous, CPU-bound, thread-safe when both embedders are: run it in the scorer's worker threads.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from router_models.embedders.protocol import FloatArray
from router_models.serving.artifact import (
    DEFAULT_ARTIFACT,
    FAST_ARTIFACT,
    ArtifactError,
    current_artifact_path,
    load_artifact,
    read_metadata,
)
from router_models.serving.batch_model import EmbeddingClassifier
from router_models.serving.scorer import ConversationShape

__all__ = ["DEFAULT_CENTRE", "HALF_WIDTH", "REFINE_ENV", "SHIPPED_BAND", "RefineBand", "RefinedClassifier",
           "front_path", "refine_choice", "refine_front", "rows_artifact"]


@dataclass(frozen=True)
class RefineBand:
    """Fast scores less than `half_width` from one of `centres` (the thresholds in use) are re-scored."""

    centres: tuple[float, ...]
    half_width: float

    def __post_init__(self) -> None:
        if not 0.0 <= self.half_width <= 1.0 or not all(0.0 <= c <= 1.0 for c in self.centres):
            raise ValueError(f"a refine band needs centres and a half width in [0, 1], got {self.centres}, "
                             f"{self.half_width}")

    def near(self, scores: Sequence[float]) -> list[int]:
        """Indices of the scores inside the band."""
        return [i for i, s in enumerate(scores) if any(abs(s - c) < self.half_width for c in self.centres)]


# Chosen with `python -m router_models.training.refine_eval` (MODEL_CARD.md, "Two-stage scoring"): a band of
# +-0.015 around each flagship share's threshold refines 26.5% of prompts (30% at a 30% flagship share) and keeps
# the mean leave-one-source-out APGR at 0.5881 against the transformer's 0.5894 (static alone: 0.5756).
HALF_WIDTH = 0.015
# Where a threshold sits before anyone names one: the fast router's 70th percentile over the seven held-out sources
# (0.2747), where the shipped policies' 30% flagship share puts the gateway's live threshold.
DEFAULT_CENTRE = 0.275
SHIPPED_BAND = RefineBand((DEFAULT_CENTRE,), HALF_WIDTH)


class RefinedClassifier(EmbeddingClassifier):
    """The fast `EmbeddingClassifier` (its embedder, router and version), with `refiner` re-scoring the texts whose
    fast score is inside `band` (module docstring)."""

    def __init__(self, fast: EmbeddingClassifier, refiner: EmbeddingClassifier, band: RefineBand,
                 version: str = "") -> None:
        super().__init__(fast.embedder, fast.router, version or fast.version)
        self.fast = fast  # the front alone (its embedder and router are this model's): the scorer's overflow model
        self.refiner = refiner
        self.band = band
        self._lock = threading.Lock()
        self._refined = 0

    def score_and_features(self, texts: Sequence[str], shapes: Sequence[ConversationShape] | None = None
                           ) -> tuple[list[float], FloatArray, FloatArray]:
        """The fast router's scores, embeddings and structural columns, with the scores inside the band replaced by
        the refiner's (on its own embedding of those texts beside the same structural columns)."""
        scores, vectors, structure = super().score_and_features(texts, shapes)
        near = self.band.near(scores)
        if near:
            refined = self.refiner.score_structured([texts[i] for i in near], structure[near])
            for i, value in zip(near, refined, strict=True):
                scores[i] = value
            with self._lock:
                self._refined += len(near)
        return scores, vectors, structure

    def refine_near(self, *thresholds: float) -> bool:
        """Centre the band on `thresholds` (the thresholds in use; the half width stays). True when that moved it
        (a cached score may then be another than the band now gives: the scorer drops its cached scores); a move of
        every centre by at most a quarter of the half width is not made."""
        band = RefineBand(tuple(sorted(set(thresholds))), self.band.half_width)
        old = self.band.centres
        if len(band.centres) == len(old) and all(abs(a - b) <= band.half_width / 4
                                                 for a, b in zip(band.centres, old, strict=True)):
            return False  # a live threshold drifting within a quarter of the half width keeps the band (and cache)
        self.band = band  # one reference swap: a batch in flight reads the old band or the new, whole
        return True

    def take_refined(self) -> int:
        """Texts the refiner scored since the last call (counting restarts)."""
        with self._lock:
            taken, self._refined = self._refined, 0
        return taken

    def take_truncated(self) -> int:
        """Texts the fast embedder cut at its word-piece limit (the refiner reads the same 64 word pieces of the
        texts it refines: not counted twice)."""
        self.refiner.take_truncated()
        return super().take_truncated()


REFINE_ENV = "CASCADE_ROUTER_REFINE"


def refine_choice() -> str:
    """What `load_model` puts in front of its artifact when the caller does not say: `$CASCADE_ROUTER_REFINE`
    ("auto", "none" or an artifact path), "auto" when unset. Read by every loader (the gateway, `cascade router
    score`, `cascade policy explain`, `cascade router route`), so they serve the same scorer."""
    return os.environ.get(REFINE_ENV) or "auto"


def refine_front(primary: str | Path | None, choice: str) -> Path | None:
    """The fast artifact that scores every text in front of `primary`, which then only refines (`RefinedClassifier`);
    None: `primary` scores alone. `choice`: "none"; "auto" (the fast shipped artifact in front of the shipped
    default, trained beside it on the same data, target and score scale; nothing in front of any other primary);
    or an artifact path. Raises `ArtifactError` for a front that predicts another target."""
    path = front_path(primary, choice)
    if path is None:
        return None
    front = load_artifact(path)
    primary_meta = _metadata_path(primary)
    if front.metadata.get("target") != read_metadata(primary_meta).get("target"):
        raise ArtifactError(f"router front artifact {path} predicts {front.metadata.get('target')!r}, not the "
                            f"target of {primary_meta}: their scores are not on one scale")
    return path


def front_path(primary: str | Path | None, choice: str) -> Path | None:
    """Which artifact `refine_front` puts in front of `primary` (None: none), read from the names alone: nothing is
    loaded or checked. The artifact whose rows the scorer hands out is this one, else `primary`."""
    if choice == "none":
        return None
    primary_meta = _metadata_path(primary)
    path = (FAST_ARTIFACT if primary_meta.resolve() == DEFAULT_ARTIFACT.resolve() else None) if choice == "auto" \
        else Path(choice).with_suffix(".json")
    return None if path is None or path.resolve() == primary_meta.resolve() else path


def rows_artifact(primary: str | Path | None = None) -> Path:
    """The metadata path of the artifact whose rows (embedding, structural columns) a scorer of `primary` (None: the
    served artifact) hands out under `$CASCADE_ROUTER_REFINE`: the front's when there is one, else `primary`'s."""
    return front_path(primary, refine_choice()) or _metadata_path(primary)


def _metadata_path(primary: str | Path | None) -> Path:
    path = Path(primary if primary is not None else current_artifact_path())
    return path / DEFAULT_ARTIFACT.name if path.is_dir() else path.with_suffix(".json")
