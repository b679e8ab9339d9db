"""The shadow comparison's judge: one fixed prompt, one word back. Pure (no I/O).

The judge pool gets the request (the text the scorer saw), the micro pool's answer as "Answer A" and the
flagship's as "Answer B", and is told to reply with one word: ``SHORT`` when A falls short of B, ``OK``
otherwise. The prompt is fixed so that verdicts stay comparable over time; changing it changes what the
labels mean. Texts are cut to `MAX_CHARS` each.
"""

from __future__ import annotations

import re

__all__ = ["JUDGE_MAX_TOKENS", "JUDGE_SYSTEM_PROMPT", "MAX_CHARS", "judge_messages", "parse_verdict"]

MAX_CHARS = 6000
JUDGE_MAX_TOKENS = 8
JUDGE_SYSTEM_PROMPT = (
    "You compare two answers to the same request. Answer A is a candidate; answer B is a reference from a "
    "stronger model. Judge correctness, completeness and helpfulness for the request, not style or length. "
    "Reply with exactly one word: SHORT if answer A falls short of answer B, or OK if answer A is as good "
    "as answer B or better."
)
_WORD = re.compile(r"[A-Za-z]+")


def judge_messages(request: str, micro_answer: str, reference_answer: str) -> list[dict[str, str]]:
    """The chat messages sent to the judge pool."""
    user = (f"Request:\n{request[:MAX_CHARS]}\n\nAnswer A:\n{micro_answer[:MAX_CHARS]}\n\n"
            f"Answer B:\n{reference_answer[:MAX_CHARS]}\n\nVerdict (SHORT or OK):")
    return [{"role": "system", "content": JUDGE_SYSTEM_PROMPT}, {"role": "user", "content": user}]


def parse_verdict(reply: str) -> bool | None:
    """True when the judge said the micro answer falls short, False when it said OK, None otherwise
    (only the first word counts, in any case)."""
    first = _WORD.search(reply)
    word = first.group(0).upper() if first else ""
    return {"SHORT": True, "OK": False}.get(word)
