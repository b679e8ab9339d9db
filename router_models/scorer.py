"""The scoring contract: text in, P(micro pool's answer falls short) out.

The gateway depends only on `Scorer` and `conversation_text`; the trained classifier, its micro-batcher and
the stand-in below all satisfy the same protocol.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

__all__ = ["LengthScorer", "Scorer", "conversation_text"]


class Scorer(Protocol):
    """Scores texts in one batch. Returns one float in [0, 1] per text, in input order.

    Implementations run CPU work off the event loop (a worker thread) and may batch concurrent callers.
    """

    async def score(self, texts: Sequence[str]) -> list[float]: ...

    async def aclose(self) -> None: ...


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: keep the text parts only
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return ""


def conversation_text(messages: Sequence[Mapping[str, Any]], max_chars: int = 2000) -> str:
    """The text the scorer sees for a conversation: the latest user turn, prefixed by the system prompt.

    The last user turn carries the task; the system prompt often carries its kind ("you are a JSON
    extractor"). Earlier turns are left out: they describe history, not the difficulty of what is asked now.
    The result is cut to `max_chars` (the embedder truncates to 256 word pieces anyway).
    """
    system = next((_content_text(m.get("content")) for m in messages if m.get("role") == "system"), "")
    user = next(
        (_content_text(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), ""
    )
    text = f"{system.strip()}\n\n{user.strip()}" if system.strip() else user.strip()
    return text[:max_chars]


class LengthScorer:
    """Stand-in scorer for tests and for running without a trained artifact: longer prompts score higher.

    score = min(1, words / `saturation_words`). Cheap, deterministic, and honest about being a heuristic.
    """

    def __init__(self, saturation_words: int = 200) -> None:
        self._saturation = float(saturation_words)

    async def score(self, texts: Sequence[str]) -> list[float]:
        return [min(1.0, len(t.split()) / self._saturation) for t in texts]

    async def aclose(self) -> None:
        return None
