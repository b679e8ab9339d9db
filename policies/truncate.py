"""Cut a chat conversation to a token budget (the ladder's `truncate_context` action). Pure.

`truncate_messages(messages, max_tokens, count_tokens)` behaves as follows:

- system messages (role `system` or `developer`) are always kept, uncut, in place;
- the other messages are kept newest first while their tokens fit in what the system messages leave;
  the oldest ones go, and a `tool` message left without the assistant turn that called it goes too;
- if not even the latest message fits, it is kept with its text cut to the budget, keeping the END of
  the text (the most recent words) — that cut is not counted as a dropped message;
- if the system messages alone use the whole budget, the latest message is kept uncut (the result then
  exceeds `max_tokens`; the engine will say so, and cutting system prompts is never right).

A message's tokens are ``count_tokens(text)`` of its text (string content, or its text parts joined);
per-message formatting overhead is not counted, so leave a margin. Input messages are never mutated;
the result holds the same dicts except a cut message, which is a copy with a string content.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from policies.context import prompt_text_of

__all__ = ["SYSTEM_ROLES", "truncate_messages"]

SYSTEM_ROLES = frozenset({"system", "developer"})

Message = Mapping[str, Any]


def _tokens(message: Message, count_tokens: Callable[[str], int]) -> int:
    return count_tokens(prompt_text_of([message]))


def _cut_to(text: str, budget: int, count_tokens: Callable[[str], int]) -> str:
    """The longest suffix of `text` whose count is <= budget (binary search over its length)."""
    low, high = 0, len(text)
    while low < high:
        mid = (low + high + 1) // 2
        if count_tokens(text[len(text) - mid :]) <= budget:
            low = mid
        else:
            high = mid - 1
    return text[len(text) - low :].lstrip()


def _keep_latest(turns: list[tuple[int, Message]], budget: int, count_tokens: Callable[[str], int]) -> set[int]:
    kept: set[int] = set()
    for index, message in reversed(turns):
        cost = _tokens(message, count_tokens)
        if cost > budget:
            break
        kept.add(index)
        budget -= cost
    for index, message in turns:  # drop tool results whose calling assistant turn is gone
        if index not in kept:
            continue
        if message.get("role") != "tool":
            break
        kept.discard(index)
    return kept


def truncate_messages(
    messages: Sequence[Message], max_tokens: int, count_tokens: Callable[[str], int]
) -> tuple[list[Message], int]:
    """`messages` cut to `max_tokens` as the module docstring describes, and how many were dropped."""
    system_cost = sum(_tokens(m, count_tokens) for m in messages if m.get("role") in SYSTEM_ROLES)
    turns = [(i, m) for i, m in enumerate(messages) if m.get("role") not in SYSTEM_ROLES]
    budget = max_tokens - system_cost
    kept = _keep_latest(turns, budget, count_tokens)
    replaced: dict[int, Message] = {}
    if turns and not kept:
        index, latest = turns[-1]
        kept.add(index)
        if budget > 0:
            replaced[index] = {**latest, "content": _cut_to(prompt_text_of([latest]), budget, count_tokens)}
    out = [replaced.get(i, m) for i, m in enumerate(messages) if m.get("role") in SYSTEM_ROLES or i in kept]
    return out, len(messages) - len(out)
