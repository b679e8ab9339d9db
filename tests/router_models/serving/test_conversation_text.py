"""What the scorer reads of a conversation: the latest user turn first, then the system prompt, then history."""

from __future__ import annotations

from router_models.serving.scorer import conversation_text


def test_latest_user_turn_first_then_system_then_earlier_turns() -> None:
    messages = [
        {"role": "system", "content": "You extract JSON."},
        {"role": "user", "content": "Write a sorting function."},
        {"role": "assistant", "content": "def sort(x): ..."},
        {"role": "user", "content": [{"type": "text", "text": "Now make it stable."}]},
    ]
    assert conversation_text(messages) == "Now make it stable.\n\nYou extract JSON.\n\nWrite a sorting function."


def test_developer_role_counts_as_system_and_the_cut_applies() -> None:
    messages = [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "x" * 50}]
    assert conversation_text(messages) == "x" * 50 + "\n\nbe brief"
    assert conversation_text(messages, max_chars=10) == "x" * 10


def test_no_user_turn_scores_the_last_message_with_text() -> None:
    messages = [{"role": "assistant", "content": "Here is the plan."}, {"role": "tool", "content": ""}]
    assert conversation_text(messages) == "Here is the plan."
    assert conversation_text([]) == ""
