"""The shadow judge's pure parts: a fair, reproducible answer order, verdicts combined over both orders, and
the conversation shown as the client sent it, cut with a marker."""

from __future__ import annotations

from collections import Counter
from typing import Any

from gateway.learning.judge import (
    MAX_CONVERSATION_CHARS,
    Outcome,
    Verdict,
    combine,
    conversation_for_judge,
    judge_messages,
    micro_first,
    parse_verdict,
    preference,
)

IDS = [f"req-{i:05d}" for i in range(2000)]


def _outcomes(judge: dict[bool, Verdict], order: dict[str, bool], both_orders: bool) -> Counter[Outcome]:
    """Outcomes over `IDS` of a judge whose verdict depends only on whether the micro answer is A."""
    out: Counter[Outcome] = Counter()
    for request_id in IDS:
        micro_is_a = order[request_id]
        first = preference(judge[micro_is_a], micro_is_a)
        second = preference(judge[not micro_is_a], not micro_is_a) if both_orders else None
        out[combine(first, second)] += 1
    return out


def test_a_position_biased_judge_prefers_no_pool() -> None:
    says_a: dict[bool, Verdict] = {True: "A", False: "A"}  # purely position-biased: always the first answer
    drawn = {i: micro_first(i) for i in IDS}
    one_order = _outcomes(says_a, drawn, both_orders=False)
    assert set(one_order) == {"micro", "flagship"}
    assert 0.45 < one_order["micro"] / len(IDS) < 0.55  # its wins split like a fair coin
    assert _outcomes(says_a, drawn, both_orders=True) == {"inconsistent": len(IDS)}  # and cancel in both orders
    fixed = {i: True for i in IDS}  # the micro answer always shown as A
    assert _outcomes(says_a, fixed, both_orders=False) == {"micro": len(IDS)}  # every win to the micro pool


def test_a_judge_that_reads_the_answers_keeps_its_preference_in_both_orders() -> None:
    prefers_flagship: dict[bool, Verdict] = {True: "B", False: "A"}  # the flagship's answer, wherever it is
    drawn = {i: micro_first(i) for i in IDS}
    assert _outcomes(prefers_flagship, drawn, both_orders=True) == {"flagship": len(IDS)}
    ties: dict[bool, Verdict] = {True: "TIE", False: "TIE"}
    assert _outcomes(ties, drawn, both_orders=True) == {"tie": len(IDS)}
    assert combine("tie", "micro") == "inconsistent" and combine("micro", None) == "micro"


def test_the_order_is_reproducible_per_request_id() -> None:
    assert [micro_first(i) for i in IDS[:50]] == [micro_first(i) for i in IDS[:50]]
    assert len({micro_first(i) for i in IDS[:50]}) == 2


def test_the_conversation_is_shown_whole_with_every_role() -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "what is this?"},
                                             {"type": "image_url", "image_url": {"url": "data:..."}}]},
                {"role": "assistant", "content": None,
                 "tool_calls": [{"type": "function", "function": {"name": "lookup", "arguments": "{}"}}]},
                {"role": "tool", "content": "a cat"},
                {"role": "user", "content": "and now?"}]
    assert conversation_for_judge(messages) == ("[system]\nbe brief\n\n[user]\nwhat is this?\n[image_url]\n\n"
                                                "[assistant]\n[tool calls: lookup]\n\n[tool]\na cat\n\n"
                                                "[user]\nand now?")


def test_a_long_conversation_keeps_its_start_and_end_with_a_marker() -> None:
    body = "x" * (3 * MAX_CONVERSATION_CHARS)
    messages = [{"role": "user", "content": "TASK: " + body}, {"role": "user", "content": body + " LAST TURN"}]
    shown = conversation_for_judge(messages)
    whole = len(conversation_for_judge(messages, limit=10**9))
    assert shown.startswith("[user]\nTASK: ") and shown.endswith(" LAST TURN")
    assert f"[... {whole - MAX_CONVERSATION_CHARS} characters of the conversation cut here ...]" in shown
    assert len(shown) < MAX_CONVERSATION_CHARS + 100
    user = judge_messages(shown, "one", "two")[1]["content"]
    assert user.startswith("Conversation:\n[user]\nTASK:") and user.endswith("Verdict (A, B or TIE):")


def test_verdict_parsing_takes_the_first_word() -> None:
    assert parse_verdict("A") == "A" and parse_verdict(" b, because...") == "B"
    assert parse_verdict("Tie.") == "TIE" and parse_verdict("tie") == "TIE"
    assert parse_verdict("") is None and parse_verdict("Answer A is better") is None
