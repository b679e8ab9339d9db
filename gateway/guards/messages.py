"""The text of a chat body's messages, read and rewritten in place of the engine's view. Pure.

Text is a message's `content` when it is a string, and each `{"type": "text", "text": ...}` part when it is a
list of parts (images, audio and other parts carry no text and are left as they are). Other fields (tool-call
arguments, names) are not read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["message_texts", "rewrite_texts", "user_text"]


def message_texts(messages: Any) -> Iterator[str]:
    """Every text segment of every message, in order."""
    for message in messages if isinstance(messages, list) else ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            yield content
        elif isinstance(content, list):
            yield from (p["text"] for p in content if _is_text_part(p))


def user_text(messages: Any, max_chars: int) -> str:
    """The user turns' text, latest first, joined by newlines and cut to `max_chars`."""
    users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"] if isinstance(
        messages, list) else []
    return "\n".join(t for m in reversed(users) for t in message_texts([m]) if t)[:max_chars]


def rewrite_texts(messages: list[Any], rewrite: Callable[[str], str]) -> list[Any] | None:
    """`messages` with every text segment passed through `rewrite`, or None when no segment changed. The input is
    never modified: changed messages (and their part lists) are copies, unchanged ones are shared."""
    out: list[Any] = []
    changed = False
    for message in messages:
        new = _rewrite_message(message, rewrite)
        changed = changed or new is not message
        out.append(new)
    return out if changed else None


def _rewrite_message(message: Any, rewrite: Callable[[str], str]) -> Any:
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        text = rewrite(content)
        return message if text == content else {**message, "content": text}
    if not isinstance(content, list):
        return message
    parts = [_rewrite_part(p, rewrite) for p in content]
    if all(new is old for new, old in zip(parts, content, strict=True)):
        return message
    return {**message, "content": parts}


def _rewrite_part(part: Any, rewrite: Callable[[str], str]) -> Any:
    if not _is_text_part(part):
        return part
    text = rewrite(part["text"])
    return part if text == part["text"] else {**part, "text": text}


def _is_text_part(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
