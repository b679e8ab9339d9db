"""The scoring contract: text in, P(micro pool's answer falls short) out.

The gateway depends only on `Scorer` and `conversation_text`; the trained classifier, its micro-batcher and
the stand-in below all satisfy the same protocol.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

__all__ = ["EmbeddingSource", "LengthScorer", "Scorer", "conversation_text"]


class Scorer(Protocol):
    """Scores texts in one batch. Returns one float in [0, 1] per text, in input order.

    Implementations run CPU work off the event loop (a worker thread) and may batch concurrent callers.
    `version` names what scores: the trained artifact's version (`artifact.artifact_version`), or the
    scorer's own name.
    """

    version: str

    async def score(self, texts: Sequence[str]) -> list[float]: ...

    async def score_one(self, text: str) -> tuple[float, str]:
        """The score of one text and the model that gave it: "primary" or "overflow" for the trained
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


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: keep the text parts only
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return ""


def conversation_text(messages: Sequence[Mapping[str, Any]], max_chars: int = 2000) -> str:
    """The text the scorer sees for a conversation, cut to `max_chars`.

    The latest user turn comes first: it carries the task, and the router was trained on bare user prompts,
    whose start is all the embedder reads (64 word pieces). Then the system prompt (it often carries the kind
    of work: "you are a JSON extractor"), then earlier user turns, latest first: a follow-up ("now make it
    shorter") is as hard as the task it follows, and the structural features count the whole context. A
    conversation with no user turn (only assistant or tool messages) is scored on its last message's text.
    """
    turns = [(str(m.get("role")), _content_text(m.get("content")).strip()) for m in messages]
    users = [text for role, text in turns if role == "user" and text]
    system = next((text for role, text in turns if role in ("system", "developer") and text), "")
    if users:
        parts = [users[-1], system, *reversed(users[:-1])]
    else:
        parts = [next((text for _, text in reversed(turns) if text), "")]
    return "\n\n".join(p for p in parts if p)[:max_chars]


class LengthScorer:
    """Stand-in scorer for tests and for running without a trained artifact: longer prompts score higher.

    score = min(1, words / `saturation_words`). Cheap, deterministic, and honest about being a heuristic.
    """

    version = "length"

    def __init__(self, saturation_words: int = 200) -> None:
        self._saturation = float(saturation_words)

    async def score(self, texts: Sequence[str]) -> list[float]:
        return [min(1.0, len(t.split()) / self._saturation) for t in texts]

    async def score_one(self, text: str) -> tuple[float, str]:
        return (await self.score([text]))[0], "length"

    async def aclose(self) -> None:
        return None
