"""What the response cache may answer and what it keys an answer by."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gateway.caching.entry import CorruptEntry, decode, encode, entry_of
from gateway.caching.keys import bypass_reason, context_digest, exact_digest, latest_user_text, reads_whole
from gateway.caching.vectors import encode_row, nearest, quantise, similarity
from gateway.serving.openai.usage import Usage

BASE: dict[str, Any] = {"model": "auto", "temperature": 0, "max_tokens": 16,
                        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}


@pytest.mark.parametrize(("change", "reason"), [
    ({}, None),
    ({"temperature": 0.0}, None),
    ({"temperature": 0.7, "seed": 7}, None),
    ({"temperature": None}, "not_deterministic"),  # unset: 1 in the OpenAI API
    ({"temperature": 0.7}, "not_deterministic"),
    ({"temperature": 0.7, "seed": True}, "not_deterministic"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"functions": [{"name": "f"}]}, "tools"),
])
def test_only_deterministic_requests_without_tools_are_eligible(change: dict[str, Any], reason: str | None) -> None:
    raw = {k: v for k, v in {**BASE, **change}.items() if v is not None}
    assert bypass_reason(raw) == reason


def test_exact_digest_ignores_what_does_not_change_the_answer() -> None:
    same = [dict(reversed(BASE.items())), {**BASE, "model": "micro"}, {**BASE, "stream": True},
            {**BASE, "stream_options": {"include_usage": True}}, {**BASE, "user": "u1"},
            {**BASE, "metadata": {"a": "b"}}]
    assert {exact_digest("m", raw) for raw in same} == {exact_digest("m", BASE)}


@pytest.mark.parametrize("change", [{"max_tokens": 17}, {"temperature": 0.1}, {"seed": 1}, {"stop": ["\n"]},
                                    {"messages": [{"role": "user", "content": "Hi!"}]}])
def test_exact_digest_differs_for_what_does(change: dict[str, Any]) -> None:
    assert exact_digest("m", {**BASE, **change}) != exact_digest("m", BASE)
    assert exact_digest("other-model", BASE) != exact_digest("m", BASE)


def test_the_semantic_context_leaves_out_only_the_latest_user_text() -> None:
    reworded = {**BASE, "messages": [BASE["messages"][0], {"role": "user", "content": "Hello"}]}
    assert context_digest("m", reworded) == context_digest("m", BASE)
    assert latest_user_text(reworded) == "Hello"
    other_system = {**BASE, "messages": [{"role": "system", "content": "Be long."}, BASE["messages"][1]]}
    assert context_digest("m", other_system) != context_digest("m", BASE)
    assert context_digest("m", {**BASE, "max_tokens": 5}) != context_digest("m", BASE)
    assert context_digest("m2", BASE) != context_digest("m", BASE)
    parts = {**BASE, "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]}
    assert latest_user_text(parts) is None


def test_a_text_longer_than_the_embedder_reads_is_not_compared() -> None:
    space = "all-MiniLM-L6-v2:onnx-int8:t64:l3"
    assert reads_whole(space, "x" * 186) and not reads_whole(space, "x" * 187)
    assert reads_whole("all-MiniLM-L6-v2:static", "x" * 10_000)  # the static table reads every word
    assert not reads_whole("not-an-embedder", "short")


def test_nearest_row_respects_context_age_and_size() -> None:
    rng = np.random.default_rng(1)
    vectors = [quantise(rng.normal(size=384)) for _ in range(4)]
    ctx, other = b"\x01" * 7 + b"\x00", b"\x02" * 8
    rows = {b"a": encode_row(ctx, 2_000_000_000, vectors[0]), b"b": encode_row(ctx, 1_000, vectors[1]),
            b"c": encode_row(other, 2_000_000_000, vectors[2]), b"d": b"short"}
    best, bad = nearest(rows, vectors[0], ctx, not_before=1_500_000_000)
    assert best is not None and best.field == b"a" and best.similarity == pytest.approx(1.0, abs=0.01)
    assert bad == 1
    found, _ = nearest(rows, vectors[1], ctx, not_before=1_500_000_000)
    assert found is not None and found.field == b"a"  # b is too old
    assert nearest(rows, vectors[2], b"\x03" * 8, not_before=0)[0] is None  # no row of that context


def test_quantised_similarity_stays_close_to_the_cosine() -> None:
    rng = np.random.default_rng(2)
    for _ in range(50):
        a = rng.normal(size=384)
        b = a + rng.normal(scale=0.5, size=384)
        cosine = float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))
        assert abs(similarity(quantise(a), quantise(b)) - cosine) < 0.01


ANSWER: dict[str, Any] = {"id": "x", "object": "chat.completion", "model": "micro-model",
          "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}],
          "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}


def test_an_entry_round_trips_and_only_whole_answers_are_kept() -> None:
    entry = entry_of("micro", "micro-model", ANSWER, Usage(3, 1))
    assert entry is not None and decode(encode(entry)) == entry
    unfinished = {**ANSWER, "choices": [{**ANSWER["choices"][0], "finish_reason": None}]}
    assert entry_of("micro", "micro-model", unfinished, Usage(3, 1)) is None
    assert entry_of("micro", "micro-model", ANSWER, None) is None
    assert entry_of("micro", "micro-model", ANSWER, Usage(3, 1, "estimate")) is None


@pytest.mark.parametrize("raw", [b"", b"not json", b"[]", b'{"format": 2}',
                                 b'{"format": 1, "pool": "micro", "model": "m", "body": {}}',
                                 b'{"format": 1, "pool": "micro", "model": "m", "body": {"choices": []}, '
                                 b'"prompt_tokens": 1, "completion_tokens": 1, "stored_at": 1}'])
def test_anything_else_is_corrupt(raw: bytes) -> None:
    with pytest.raises(CorruptEntry):
        decode(raw)
