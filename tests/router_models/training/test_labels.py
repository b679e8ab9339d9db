"""The label-file format: both forms and labels per pool read, every bad row named by file:line and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from router_models.serving.scorer import ConversationShape, prompt_shape
from router_models.training.labels import (
    LabelError,
    examples_from_rows,
    label_rows,
    read_label_file,
    read_label_rows,
    split_held_back,
)


def _write(path: Path, rows: list[object]) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_both_forms_and_messages(tmp_path: Path) -> None:
    path = _write(tmp_path / "l.jsonl", [
        {"prompt": "a", "needs_flagship": 1},
        {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "b"}],
         "micro": 0.4, "flagship": 0.9, "source": "support"},
        "",
    ])
    a, b = read_label_file(path)
    assert (a.text, a.weak, a.strong, a.target, a.source) == ("a", 0.0, 1.0, 1.0, "labels:labels")
    assert (b.text, b.weak, b.strong, b.source) == ("b\n\nbe brief", 0.4, 0.9, "labels:support")
    assert a.shape == prompt_shape("a")
    assert b.shape == ConversationShape(system_prompt=True, total_chars=9, latest_chars=1)


@pytest.mark.parametrize(("row", "message"), [
    ({"needs_flagship": 1}, "'prompt'"),
    ({"prompt": "x", "needs_flagship": 1.5}, "'needs_flagship' must be a number in \\[0, 1\\]"),
    ({"prompt": "x", "micro": 0.5}, "give 'needs_flagship'"),
    ({"prompt": "x", "pool": "code"}, "give 'needs_flagship'"),  # a ledger row's "pool" is information only
    ({"prompt": "x", "pools": {"code": 2}}, "pools: field 'code' must be a number in \\[0, 1\\]"),
    ({"prompt": "x", "pools": {"@micro": 1}}, "not starting with '@'"),
    ({"prompt": "x", "pools": {}}, "'pools' must be an object"),
    ({"prompt": "x", "pools": {"code": "good"}}, "pools: field 'code' must be a number"),
    ({"prompt": "x", "micro": "high", "flagship": 1}, "'micro'"),
    ({"prompt": "x", "needs_flagship": 0, "source": ""}, "'source'"),
    ({"prompt": "x", "needs_flagship": 0, "shape": {"user_turns": -1}}, "'shape'"),
    ({"prompt": "x", "needs_flagship": 0, "shape": {"system_prompt": "yes"}}, "'shape'"),
    ([1, 2], "expected a JSON object"),
])
def test_bad_rows_name_line_and_field(tmp_path: Path, row: object, message: str) -> None:
    path = _write(tmp_path / "l.jsonl", [{"prompt": "ok", "needs_flagship": 0}, row])
    with pytest.raises(LabelError, match=message) as err:
        read_label_file(path)
    assert f"{path}:2" in str(err.value)


def test_labels_per_pool_are_read_and_a_row_of_pools_alone_gives_no_gap(tmp_path: Path) -> None:
    path = _write(tmp_path / "l.jsonl", [
        {"prompt": "a", "pools": {"code": 0}, "pool": "general"},
        {"prompt": "b", "pools": {"general": 0.2, "code": 1}, "needs_flagship": 1},
        {"prompt": "c", "needs_flagship": 0},
    ])
    a, b, c = read_label_rows(path)
    assert (a.pools, a.has_gap) == ((("code", 0.0),), False)
    assert (b.pools, b.has_gap, b.example.weak) == ((("general", 0.2), ("code", 1.0)), True, 0.0)
    assert (c.pools, c.has_gap) == ((), True)
    assert [e.text for e in read_label_file(path)] == ["b", "c"]  # what trains a router: rows that give a gap


def test_not_json_and_empty_file(tmp_path: Path) -> None:
    with pytest.raises(LabelError, match=r":1: not valid JSON"):
        read_label_file(_write(tmp_path / "bad.jsonl", ["{nope"]))
    with pytest.raises(LabelError, match="no label rows"):
        read_label_file(_write(tmp_path / "empty.jsonl", [""]))


def test_ledger_rows_and_a_stable_split() -> None:
    rows = [{"id": str(i), "prompt": f"question {i}", "needs_flagship": i % 2, "source": "feedback"}
            for i in range(200)]
    ex = examples_from_rows(rows, default_source="ledger")
    train, held = split_held_back(ex, 0.3)
    assert len(train) + len(held) == 200 and 30 < len(held) < 90
    assert {e.key for e in train}.isdisjoint({e.key for e in held})
    assert split_held_back(ex, 0.3) == (train, held)
    with pytest.raises(LabelError, match="row 2"):
        examples_from_rows([rows[0], {"prompt": "x"}], origin="row")


@pytest.mark.parametrize(("score", "shown"), [
    ("NaN", "nan"), ("Infinity", "inf"), ("-Infinity", "-inf"), ("1e999", "inf"), ("-0.1", "-0.1"),
    ('"0.5"', "'0.5'"), ("null", "None"), ("[1]", r"\[1\]"),
])
def test_a_score_that_is_not_a_number_in_range_names_its_line(tmp_path: Path, score: str, shown: str) -> None:
    path = _write(tmp_path / "l.jsonl", [{"prompt": "ok", "needs_flagship": 0}, "",
                                         f'{{"prompt": "x", "needs_flagship": {score}}}'])
    with pytest.raises(LabelError, match=f"'needs_flagship' must be a number in \\[0, 1\\], got {shown}$") as err:
        read_label_file(path)
    assert str(err.value).startswith(f"{path}:3: ")  # the blank line 2 is counted: the line is the file's


@pytest.mark.parametrize(("field", "value"), [("id", 7), ("id", None), ("tenant", ["acme"]), ("tenant", 3)])
def test_an_id_or_tenant_that_is_not_a_string_names_its_line(tmp_path: Path, field: str, value: object) -> None:
    path = _write(tmp_path / "l.jsonl", [{"prompt": "ok", "needs_flagship": 0},
                                         {"prompt": "x", "needs_flagship": 0, field: value}])
    with pytest.raises(LabelError, match=f"^{path}:2: field '{field}' must be a string, got "):
        read_label_rows(path)


def test_an_empty_tenant_names_none() -> None:  # a ledger row of a request kept without a tenant
    (row,) = label_rows([{"id": "r1", "prompt": "x", "needs_flagship": 0, "tenant": ""}], tenant="acme")
    assert (row.request_id, row.tenant) == ("r1", "")


def test_a_row_of_another_tenant_is_refused_when_reading_for_one(tmp_path: Path) -> None:
    path = _write(tmp_path / "l.jsonl", [{"prompt": "a", "needs_flagship": 0, "tenant": "acme", "id": "r1"},
                                         {"prompt": "b", "needs_flagship": 1},
                                         {"prompt": "c", "needs_flagship": 1, "tenant": "globex"}])
    with pytest.raises(LabelError) as err:
        read_label_rows(path, tenant="acme")
    assert str(err.value) == f"{path}:3: field 'tenant' is 'globex', but these labels are for tenant 'acme'"
    first, second, third = read_label_rows(path)  # for no one tenant (the shared memory, training) all are read
    assert (first.where, first.request_id, first.tenant) == (f"{path}:1", "r1", "acme")
    assert (second.request_id, second.tenant, third.tenant) == ("", "", "globex")
