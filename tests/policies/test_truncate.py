"""Context truncation: system prompts stay, the latest turns stay, the oldest go, a lone turn is cut."""

from __future__ import annotations

from typing import Any

from policies.truncate import truncate_messages


def words(text: str) -> int:
    return len(text.split())


def _m(role: str, n: int, tag: str = "w") -> dict[str, Any]:
    return {"role": role, "content": " ".join(f"{tag}{i}" for i in range(n))}


def test_fits_unchanged() -> None:
    msgs = [_m("system", 2), _m("user", 3), _m("assistant", 3)]
    out, dropped = truncate_messages(msgs, 8, words)
    assert out == msgs and dropped == 0


def test_drops_oldest_turns_keeps_system_in_place() -> None:
    msgs = [_m("system", 2), _m("user", 4, "a"), _m("assistant", 4, "b"), _m("developer", 1), _m("user", 3, "c")]
    out, dropped = truncate_messages(msgs, 10, words)
    assert out == [msgs[0], msgs[2], msgs[3], msgs[4]] and dropped == 1
    out, dropped = truncate_messages(msgs, 6, words)
    assert out == [msgs[0], msgs[3], msgs[4]] and dropped == 2
    assert msgs[1]["content"].startswith("a0")  # inputs not mutated


def test_latest_turn_cut_keeping_its_end() -> None:
    msgs = [_m("system", 2), _m("user", 10)]
    out, dropped = truncate_messages(msgs, 5, words)
    assert dropped == 0 and out[0] is msgs[0]
    assert words(out[1]["content"]) == 3 and out[1]["content"].endswith("w9")
    assert msgs[1]["content"].startswith("w0")


def test_text_parts_counted_and_cut() -> None:
    msgs = [{"role": "user", "content": [{"type": "text", "text": "one two three four"}]}]
    out, _ = truncate_messages(msgs, 2, words)
    assert out[0]["content"] == "three four"


def test_system_over_budget_keeps_latest_turn_uncut() -> None:
    msgs = [_m("system", 10), _m("user", 2), _m("user", 2)]
    out, dropped = truncate_messages(msgs, 5, words)
    assert out == [msgs[0], msgs[2]] and dropped == 1


def test_orphaned_tool_results_are_dropped_too() -> None:
    call = {"role": "assistant", "content": "x " * 6, "tool_calls": [{"id": "1"}]}
    msgs = [_m("user", 1), call, {"role": "tool", "content": "result", "tool_call_id": "1"}, _m("user", 2)]
    out, dropped = truncate_messages(msgs, 4, words)
    assert out == [msgs[3]] and dropped == 3
