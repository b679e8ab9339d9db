"""The shadow comparison's judge: one fixed prompt, one word back, answers in a random order. Pure (no I/O).

The judge pool gets the conversation as the client sent it (`conversation_for_judge`), two answers to its
last turn as "Answer A" and "Answer B", and is told to reply with one word: ``A``, ``B`` or ``TIE``. Which
pool's answer is A is drawn per request id (`micro_first`: seeded by the id, so a verdict can be reproduced)
rather than always the micro pool's, because an LLM judge prefers one position (usually the first); with a
fixed order that bias would become a preference for one pool. Where the policy asks for both orders
(`learning.shadow.both_orders`), the judge sees the pair twice, swapped, and `combine` keeps a verdict only
when both readings agree: a judge that only follows the position then yields ``inconsistent``, never a win.

The prompt is fixed so that verdicts stay comparable over time; changing it changes what the labels mean.
The conversation is cut to `MAX_CONVERSATION_CHARS` (its start and its end kept, `TRUNCATION_MARKER` where the
middle was), each answer to `MAX_ANSWER_CHARS`.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

__all__ = [
    "JUDGE_MAX_TOKENS",
    "JUDGE_SYSTEM_PROMPT",
    "MAX_ANSWER_CHARS",
    "MAX_CONVERSATION_CHARS",
    "TRUNCATION_MARKER",
    "Outcome",
    "Preference",
    "Verdict",
    "combine",
    "conversation_for_judge",
    "judge_messages",
    "micro_first",
    "parse_verdict",
    "preference",
]

MAX_CONVERSATION_CHARS = 24_000  # about 6k tokens: fits the judge's context beside two answers
MAX_ANSWER_CHARS = 6000
TRUNCATION_MARKER = "[... {cut} characters of the conversation cut here ...]"
JUDGE_MAX_TOKENS = 8
JUDGE_SYSTEM_PROMPT = (
    "You compare two answers to the last message of a conversation. Judge correctness, completeness and "
    "helpfulness for what was asked, not style, length or the order in which the answers are shown. Reply "
    "with exactly one word: A if answer A is better, B if answer B is better, or TIE if they are equally good."
)
_WORD = re.compile(r"[A-Za-z]+")

Verdict = Literal["A", "B", "TIE"]
Preference = Literal["micro", "flagship", "tie"]
Outcome = Literal["micro", "flagship", "tie", "inconsistent"]


def micro_first(request_id: str) -> bool:
    """Whether the micro answer is shown as A for `request_id`: a fair coin seeded by the id (reproducible,
    independent of the process and of `PYTHONHASHSEED`)."""
    return random.Random(f"judge-order:{request_id}").random() < 0.5


def _content_text(content: Any) -> str:
    """A message's text: a string as is, content parts' text joined, other parts named in brackets."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    parts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        text = part.get("text") if isinstance(part, dict) else None
        parts.append(text if isinstance(text, str) else f"[{kind or 'part'}]")
    return "\n".join(parts)


def conversation_for_judge(messages: Sequence[Mapping[str, Any]], limit: int = MAX_CONVERSATION_CHARS) -> str:
    """The client's messages as a transcript, one ``[role]`` block per message (tool calls are named).

    When longer than `limit` characters, the first and the last `limit // 2` are kept with `TRUNCATION_MARKER`
    (naming how many characters were cut) between them: the task is usually stated first and the turn being
    answered is last."""
    blocks = []
    for message in messages:
        text = _content_text(message.get("content"))
        calls = message.get("tool_calls")
        if isinstance(calls, list) and calls:
            names = [str((c.get("function") or {}).get("name", "?")) for c in calls if isinstance(c, dict)]
            text = f"{text}\n[tool calls: {', '.join(names)}]".lstrip("\n")
        blocks.append(f"[{message.get('role', 'user')}]\n{text}")
    transcript = "\n\n".join(blocks)
    if len(transcript) <= limit:
        return transcript
    half = limit // 2
    marker = TRUNCATION_MARKER.format(cut=len(transcript) - 2 * half)
    return f"{transcript[:half]}\n{marker}\n{transcript[-half:]}"


def judge_messages(conversation: str, answer_a: str, answer_b: str) -> list[dict[str, str]]:
    """The chat messages sent to the judge pool (`conversation` from `conversation_for_judge`)."""
    user = (f"Conversation:\n{conversation}\n\nAnswer A:\n{answer_a[:MAX_ANSWER_CHARS]}\n\n"
            f"Answer B:\n{answer_b[:MAX_ANSWER_CHARS]}\n\nVerdict (A, B or TIE):")
    return [{"role": "system", "content": JUDGE_SYSTEM_PROMPT}, {"role": "user", "content": user}]


def parse_verdict(reply: str) -> Verdict | None:
    """``A``, ``B`` or ``TIE`` from the judge's reply (only the first word counts, in any case), else None."""
    first = _WORD.search(reply)
    word = first.group(0).upper() if first else ""
    return word if word in ("A", "B", "TIE") else None  # type: ignore[return-value]


def preference(verdict: Verdict, micro_is_a: bool) -> Preference:
    """The pool a verdict prefers, given which answer was shown as A."""
    if verdict == "TIE":
        return "tie"
    return "micro" if (verdict == "A") == micro_is_a else "flagship"


def combine(first: Preference, second: Preference | None) -> Outcome:
    """One outcome from a judgement in one order and, when there was one, in the other: the same
    preference twice is that preference; different ones are ``inconsistent`` (the judge followed the
    position, or cannot tell the answers apart)."""
    if second is None or second == first:
        return first
    return "inconsistent"
