"""What the scorer reads of a conversation: its text (`conversation_text`) and its shape (`conversation_shape`).

Below both the embedders (the structural features read the shape) and the serving scorer (`serving.scorer`
re-exports these names for the gateway), so neither imports the other for them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["SCORING_CHARS", "ConversationShape", "conversation_shape", "conversation_text", "prompt_shape",
           "read_conversation"]

SCORING_CHARS = 2000  # the scoring text's length at most, as the router was trained (`training.outcomes.MAX_CHARS`)

_Turns = list[tuple[str, str]]  # (role, stripped text) of each message


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: keep the text parts only
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return ""


def _turns(messages: Sequence[Mapping[str, Any]]) -> _Turns:
    return [(str(m.get("role")), _content_text(m.get("content")).strip()) for m in messages]


def read_conversation(messages: Sequence[Mapping[str, Any]],
                      max_chars: int = SCORING_CHARS) -> tuple[str, ConversationShape]:
    """(`conversation_text`, `conversation_shape`) of `messages`, reading each message once (the gateway's
    per-request case)."""
    turns = _turns(messages)
    return _text(turns, max_chars), _shape(turns)


def conversation_text(messages: Sequence[Mapping[str, Any]], max_chars: int = SCORING_CHARS) -> str:
    """The text the scorer sees for a conversation, cut to `max_chars`.

    The latest user turn comes first: it carries the task, and the router was trained on bare user prompts,
    whose start is all the embedder reads (64 word pieces). Then the system prompt (it often carries the kind
    of work: "you are a JSON extractor"), then earlier user turns, latest first: a follow-up ("now make it
    shorter") is as hard as the task it follows, and the structural features count what the cut keeps. A
    conversation with no user turn (only assistant or tool messages) is scored on its last message's text. What
    the cut and the embedder cannot show (the turns, the whole length) is `conversation_shape`'s.
    """
    return _text(_turns(messages), max_chars)


def _text(turns: _Turns, max_chars: int) -> str:
    users = [text for role, text in turns if role == "user" and text]
    system = next((text for role, text in turns if role in ("system", "developer") and text), "")
    if not users:
        return next((text for _, text in reversed(turns) if text), "")[:max_chars]
    kept: list[str] = []
    length = -2
    for part in (users[-1], system, *reversed(users[:-1])):  # only what the cut keeps is joined: a conversation
        if part:                                              # of 500 long turns costs what one turn does
            kept.append(part[:max_chars])
            length += len(kept[-1]) + 2
            if length >= max_chars:
                break
    return "\n\n".join(kept)[:max_chars]


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
    return _shape(_turns(messages))


def _shape(turns: _Turns) -> ConversationShape:
    roles = [role for role, _ in turns]
    users = [text for role, text in turns if role == "user" and text]
    return ConversationShape(
        user_turns=len(users),
        assistant_turns=roles.count("assistant"),
        tool_messages=roles.count("tool") + roles.count("function"),
        system_prompt=any(role in ("system", "developer") and text for role, text in turns),
        total_chars=sum(len(text) for _, text in turns),
        latest_chars=len(users[-1]) if users else 0,
    )
