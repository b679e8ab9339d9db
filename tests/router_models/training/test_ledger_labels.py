"""The training reader of the gateway's own labels: row format, label mapping, precedence, SCAN over many keys;
the id reader agrees with it without reading prompt texts."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from router_models.serving.scorer import ConversationShape, prompt_shape
from router_models.training.labels import examples_from_rows, label_rows
from router_models.training.ledger_labels import LabelKeys, label_row, read_ledger_label_ids, read_ledger_labels
from tests.conftest import SHARED_URL

PROMPT = {"text": "sys\n\nwhat is 2+2", "score": "0.25", "pool": "micro", "micro": "1", "tenant": "acme", "at": "1.0"}


def test_feedback_on_a_micro_answer_is_one_minus_its_score() -> None:
    row = label_row("r1", PROMPT, {"score": "0.8", "thumbs": ""}, {}, {})
    assert row == {"id": "r1", "prompt": "sys\n\nwhat is 2+2", "needs_flagship": pytest.approx(0.2),
                   "pools": {"micro": pytest.approx(0.8)},  # and the label of the pool that answered
                   "source": "feedback", "tenant": "acme", "pool": "micro", "score": 0.25}
    assert label_row("r1", PROMPT, {"score": "0.0", "thumbs": "down"}, {}, {})["needs_flagship"] == 1.0  # type: ignore[index]


def test_feedback_on_another_pools_answer_is_that_pools_label_and_no_gap() -> None:
    for pool in ("flagship", "code"):
        served = {**PROMPT, "pool": pool, "micro": "0"}
        row = label_row("r1", served, {"score": "0.0"}, {}, {})
        assert row == {"id": "r1", "prompt": "sys\n\nwhat is 2+2", "pools": {pool: 0.0}, "source": "feedback",
                       "tenant": "acme", "pool": pool, "score": 0.25}
        # ... beside its escalation label, which gives the gap
        row = label_row("r1", served, {"score": "0.0"}, {}, {"escalated": "1", "confidence": "0.1"})
        assert row is not None and (row["source"], row["needs_flagship"], row["pools"]) == ("escalation", 1.0,
                                                                                           {pool: 0.0})
    assert label_row("r1", {**PROMPT, "pool": "", "micro": "0"}, {"score": "0.0"}, {}, {}) is None  # no pool named


def test_a_pool_only_row_is_a_label_row_that_trains_no_router() -> None:
    row = label_row("r1", {**PROMPT, "pool": "code", "micro": "0"}, {"score": "1.0"}, {}, {})
    (read,) = label_rows([row], origin="ledger row")
    assert not read.has_gap and read.pools == (("code", 1.0),)
    assert examples_from_rows([row]) == []


def test_precedence_shadow_then_feedback_then_escalation() -> None:
    feedback, shadow, cascade = {"score": "1.0"}, {"short": "1"}, {"escalated": "0", "confidence": "0.9"}
    assert label_row("r", PROMPT, feedback, shadow, cascade)["source"] == "shadow"  # type: ignore[index]
    assert label_row("r", PROMPT, feedback, shadow, cascade)["needs_flagship"] == 1.0  # type: ignore[index]
    assert label_row("r", PROMPT, feedback, {}, cascade)["source"] == "feedback"  # type: ignore[index]
    assert label_row("r", PROMPT, feedback, {}, cascade)["needs_flagship"] == 0.0  # type: ignore[index]
    assert label_row("r", PROMPT, {}, {}, cascade)["source"] == "escalation"  # type: ignore[index]
    assert label_row("r", PROMPT, {}, {"short": "0"}, {})["needs_flagship"] == 0.0  # type: ignore[index]


def test_no_label_or_no_prompt_yields_no_row() -> None:
    assert label_row("r", PROMPT, {}, {}, {}) is None
    assert label_row("r", {}, {"score": "0.0"}, {"short": "1"}, {}) is None
    assert label_row("r", {**PROMPT, "score": "nan"}, {}, {"short": "1"}, {}) is None
    assert label_row("r", PROMPT, {"score": "1.5"}, {"short": "maybe"}, {}) is None


@pytest.mark.redis
def test_reader_scans_every_kept_prompt_and_joins_its_labels(prefix: str) -> None:
    keys = LabelKeys(prefix)
    client = redis.Redis.from_url(SHARED_URL)
    try:
        pipe = client.pipeline(transaction=False)
        for i in range(1203):  # more than one SCAN page and more than one read batch
            rid = f"req_{i:05d}"
            prompt: dict[Any, Any] = {**PROMPT, "text": f"prompt {i}", "tenant": f"t{i % 3}"}
            pipe.hset(keys.prompt(rid), mapping=prompt)
            if i % 3 == 0:
                pipe.hset(keys.feedback(rid), mapping={"score": "0.0", "thumbs": "down", "tenant": "t0"})
            if i % 3 == 1:
                pipe.hset(keys.shadow(rid), mapping={"short": "0", "verdict": "OK"})
                pipe.hset(keys.feedback(rid), mapping={"score": "0.0", "thumbs": "down", "tenant": "t1"})
        pipe.hset(keys.feedback("req_gone"), mapping={"score": "0.0"})  # prompt expired: no row
        pipe.hset(f"{prefix}learn:prompt-like:x", mapping=dict[Any, Any](PROMPT))  # not a prompt key
        pipe.execute()
    finally:
        client.close()
    rows = read_ledger_labels(SHARED_URL, key_prefix=prefix)
    assert len(rows) == 802  # i % 3 == 2 has no label
    assert [r["id"] for r in rows] == sorted(r["id"] for r in rows)
    by_id = {r["id"]: r for r in rows}
    assert by_id["req_00000"] == {"id": "req_00000", "prompt": "prompt 0", "needs_flagship": 1.0,
                                  "pools": {"micro": 0.0}, "source": "feedback", "tenant": "t0", "pool": "micro",
                                  "score": 0.25}
    assert (by_id["req_00001"]["source"], by_id["req_00001"]["needs_flagship"]) == ("shadow", 0.0)
    assert "req_00002" not in by_id and "req_gone" not in by_id
    assert read_ledger_labels(SHARED_URL, key_prefix=prefix + "other:") == []


def test_a_record_without_shape_fields_trains_as_one_user_turn() -> None:
    """Records kept before the gateway stored shapes (or with a broken one) give rows without a shape; they train
    as a plain prompt of their text."""
    shaped = {**PROMPT, "user_turns": "3", "assistant_turns": "2", "tool_messages": "0", "system_prompt": "1",
              "total_chars": "4000", "latest_chars": "12"}
    row = label_row("r", shaped, {}, {"short": "1"}, {})
    assert row is not None and row["shape"] == {"user_turns": 3, "assistant_turns": 2, "tool_messages": 0,
                                                "system_prompt": True, "total_chars": 4000, "latest_chars": 12}
    assert examples_from_rows([row])[0].shape == ConversationShape(3, 2, 0, True, 4000, 12)
    for record in (PROMPT, {**shaped, "total_chars": "-1"}, {**shaped, "system_prompt": "yes"}):
        old = label_row("r", record, {}, {"short": "1"}, {})
        assert old is not None and "shape" not in old
        assert examples_from_rows([old])[0].shape == prompt_shape(PROMPT["text"])


@pytest.mark.redis
def test_the_id_reader_lists_exactly_the_gap_rows_of_the_row_reader_without_reading_prompt_texts(
        prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    keys = LabelKeys(prefix)
    flagship = {**PROMPT, "pool": "flagship", "micro": "0"}
    records: dict[str, tuple[dict[str, str], dict[str, str], dict[str, str], dict[str, str]]] = {
        "feedback": (PROMPT, {"score": "0.8"}, {}, {}),
        "shadow": (PROMPT, {}, {"short": "1"}, {}),
        "shadow-inconsistent-then-feedback": (PROMPT, {"score": "0.1"}, {"short": ""}, {}),
        "escalation": (flagship, {}, {}, {"escalated": "0"}),
        "flagship-feedback-only": (flagship, {"score": "0.0"}, {}, {}),
        "no-label": (PROMPT, {}, {}, {}),
        "bad-labels": (PROMPT, {"score": "1.5"}, {"short": "maybe"}, {"escalated": "2"}),
        "empty-text": ({**PROMPT, "text": ""}, {}, {"short": "1"}, {}),
        "no-text": ({k: v for k, v in PROMPT.items() if k != "text"}, {}, {"short": "1"}, {}),
        "nan-score": ({**PROMPT, "score": "nan"}, {}, {"short": "1"}, {}),
        "no-score": ({k: v for k, v in PROMPT.items() if k != "score"}, {}, {"short": "1"}, {}),
        "no-micro-field": ({k: v for k, v in PROMPT.items() if k != "micro"}, {"score": "0.5"}, {}, {}),
    }
    client = redis.Redis.from_url(SHARED_URL)
    try:
        pipe = client.pipeline(transaction=False)
        for i in range(1100):  # more than one read batch; every case many times over
            name, (prompt, feedback, shadow, cascade) = list(records.items())[i % len(records)]
            rid = f"{name}-{i:04d}"
            stored = {**prompt, "text": f"secret prompt {i}"} if prompt.get("text") else prompt
            pipe.hset(keys.prompt(rid), mapping=dict[Any, Any](stored))
            for key, fields in ((keys.feedback, feedback), (keys.shadow, shadow), (keys.cascade, cascade)):
                if fields:
                    pipe.hset(key(rid), mapping=dict[Any, Any](fields))
        pipe.hset(keys.shadow("expired"), mapping={"short": "1"})  # a label whose prompt has expired
        pipe.execute()
    finally:
        client.close()
    rows = read_ledger_labels(SHARED_URL, key_prefix=prefix)
    kinds = {str(r["id"]).rsplit("-", 1)[0] for r in rows}
    assert kinds == {"feedback", "shadow", "shadow-inconsistent-then-feedback", "escalation",  # rows kept, dropped
                     "flagship-feedback-only", "no-micro-field"}  # the last two: labels per pool only, no gap
    gaps = [r for r in rows if "needs_flagship" in r]
    assert {str(r["id"]).rsplit("-", 1)[0] for r in gaps} == kinds - {"flagship-feedback-only", "no-micro-field"}

    replies: list[Any] = []
    execute = redis.client.Pipeline.execute

    def spy(self: redis.client.Pipeline, raise_on_error: bool = True) -> list[Any]:
        replies.extend(result := execute(self, raise_on_error))
        return result

    monkeypatch.setattr(redis.client.Pipeline, "execute", spy)
    ids = read_ledger_label_ids(SHARED_URL, key_prefix=prefix)
    assert ids == {str(r["id"]) for r in gaps} and len(ids) == len(gaps)  # what a retrain learns from
    assert replies and "secret prompt" not in repr(replies)  # no prompt text crossed the wire
    assert read_ledger_label_ids(SHARED_URL, key_prefix=prefix + "other:") == set()
