"""The scoring contract: a conversation's text and shape in, P(micro pool's answer falls short) out.

The gateway depends only on `Scorer`, `conversation_text` and `conversation_shape`; the trained classifier, its
micro-batcher and the stand-in below all satisfy the same protocol.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

__all__ = ["ConversationShape", "EmbeddingSource", "LengthScorer", "Scorer", "conversation_shape", "conversation_text",
           "prompt_shape"]


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
    shorter") is as hard as the task it follows, and the structural features count what the cut keeps. A
    conversation with no user turn (only assistant or tool messages) is scored on its last message's text. What
    the cut and the embedder cannot show (the turns, the whole length) is `conversation_shape`'s.
    """
    turns = [(str(m.get("role")), _content_text(m.get("content")).strip()) for m in messages]
    users = [text for role, text in turns if role == "user" and text]
    system = next((text for role, text in turns if role in ("system", "developer") and text), "")
    if users:
        parts = [users[-1], system, *reversed(users[:-1])]
    else:
        parts = [next((text for _, text in reversed(turns) if text), "")]
    return "\n\n".join(p for p in parts if p)[:max_chars]


@dataclass(frozen=True, slots=True)
class ConversationShape:
    """What the scoring text cannot show of a conversation: its turns and its whole length, computed once from
    the messages (`conversation_shape`). Characters count every message's text, uncut (`conversation_text` keeps
    at most 2,000 of them); `latest_chars` is the latest user turn's. A plain prompt has the shape of one user
    turn of that text (`prompt_shape`). Hashable: the scorer's cache keys on (text, shape)."""

    user_turns: int = 1
    assistant_turns: int = 0
    tool_messages: int = 0
    system_prompt: bool = False
    total_chars: int = 0
    latest_chars: int = 0


def prompt_shape(text: str) -> ConversationShape:
    """The shape of a plain prompt (an exam question, a legacy completion prompt, a label row's `prompt`)."""
    return ConversationShape(total_chars=len(text), latest_chars=len(text))


def conversation_shape(messages: Sequence[Mapping[str, Any]]) -> ConversationShape:
    """The shape of a chat conversation, counted over every message (roles `user`, `assistant`, `tool` or
    `function`, `system` or `developer`; others count toward the length only)."""
    roles = [str(m.get("role")) for m in messages]
    texts = [_content_text(m.get("content")).strip() for m in messages]
    users = [text for role, text in zip(roles, texts, strict=True) if role == "user" and text]
    return ConversationShape(
        user_turns=len(users),
        assistant_turns=roles.count("assistant"),
        tool_messages=roles.count("tool") + roles.count("function"),
        system_prompt=any(role in ("system", "developer") and text for role, text in zip(roles, texts, strict=True)),
        total_chars=sum(map(len, texts)),
        latest_chars=len(users[-1]) if users else 0,
    )


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
