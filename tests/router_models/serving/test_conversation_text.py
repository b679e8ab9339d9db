"""What the scorer reads of a conversation: the latest user turn first, then the system prompt, then history; and
the shape of the whole conversation (turns, uncut length)."""

from __future__ import annotations

from typing import Any

from router_models.serving.scorer import (
    ConversationShape,
    conversation_shape,
    conversation_text,
    prompt_shape,
    read_conversation,
)


def test_latest_user_turn_first_then_system_then_earlier_turns() -> None:
    messages: list[dict[str, Any]] = [
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


def test_the_shape_counts_turns_and_the_whole_uncut_length() -> None:
    history = [{"role": "user", "content": "x" * 3000}, {"role": "assistant", "content": "y" * 1500}]
    messages: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}, *history,
                                      {"role": "tool", "content": "42"},
                                      {"role": "user", "content": [{"type": "text", "text": "and now?"}]}]
    assert len(conversation_text(messages)) == 2000  # the text is cut; the shape is not
    assert conversation_shape(messages) == ConversationShape(
        user_turns=2, assistant_turns=1, tool_messages=1, system_prompt=True,
        total_chars=len("be brief") + 3000 + 1500 + 2 + len("and now?"), latest_chars=len("and now?"))


def test_a_plain_prompt_is_one_user_turn() -> None:
    text = "What is 2 + 2?"
    assert prompt_shape(text) == conversation_shape([{"role": "user", "content": text}])
    assert prompt_shape(text) == ConversationShape(user_turns=1, total_chars=len(text), latest_chars=len(text))
    assert conversation_shape([]) == ConversationShape(user_turns=0)


def test_one_reading_gives_both_the_text_and_the_shape() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "developer", "content": "reply in JSON"}, {"role": "user", "content": "first " * 500},
        {"role": "assistant", "content": "ok"}, {"role": "function", "content": "{}"},
        {"role": "user", "content": [{"type": "text", "text": "then?"}, {"type": "image_url"}]}]
    for given in (messages, messages[-1:], messages[2:4], []):
        assert read_conversation(given) == (conversation_text(given), conversation_shape(given))
    assert read_conversation(messages, 50)[0] == conversation_text(messages, 50)
