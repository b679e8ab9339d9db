"""Checks across label rows: a row naming a request the ledger did not keep (or kept for another tenant) is refused
by its line, and labels of one prompt that contradict each other are counted with one pair shown.
The label rows are written here: they test the checks, never what labels buy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from router_models.training.label_checks import check_request_ids, find_contradictions
from router_models.training.labels import LabelError, LabelRow, label_rows, read_label_rows
from router_models.training.ledger_labels import LabelKeys, kept_request_tenants
from tests.conftest import SHARED_URL


def _file(path: Path, rows: list[dict[str, object]]) -> list[LabelRow]:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return read_label_rows(path)


OWNERS = {"req-1": "acme", "req-2": "acme", "req-9": "globex"}


def test_rows_of_known_requests_of_the_tenant_pass(tmp_path: Path) -> None:
    rows = _file(tmp_path / "l.jsonl", [{"id": "req-1", "prompt": "a", "needs_flagship": 1},
                                        {"id": "req-2", "prompt": "b", "needs_flagship": 0}])
    check_request_ids(rows, OWNERS, "acme")
    check_request_ids(rows, OWNERS)


@pytest.mark.parametrize(("row", "tenant", "message"), [
    ({"id": "req-404", "prompt": "x", "needs_flagship": 1}, "acme",
     "field 'id': no request 'req-404' is on record in the ledger"),
    ({"id": "req-9", "prompt": "x", "needs_flagship": 1}, "acme",
     "field 'id': request 'req-9' is tenant 'globex''s, but these labels are for tenant 'acme'"),
    ({"prompt": "x", "needs_flagship": 1}, None, "field 'id' is missing"),
])
def test_a_row_naming_an_unknown_or_foreign_request_is_refused_by_its_line(
        tmp_path: Path, row: dict[str, object], tenant: str | None, message: str) -> None:
    path = tmp_path / "l.jsonl"
    rows = _file(path, [{"id": "req-1", "prompt": "a", "needs_flagship": 1},
                        {"id": "req-2", "prompt": "b", "needs_flagship": 0}, row])
    with pytest.raises(LabelError) as err:
        check_request_ids(rows, OWNERS, tenant)
    assert str(err.value).startswith(f"{path}:3: {message}")


def test_contradicting_labels_of_one_prompt_or_one_request_are_counted_with_a_pair(tmp_path: Path) -> None:
    path = tmp_path / "l.jsonl"
    rows = _file(path, [
        {"prompt": "Say hello.", "needs_flagship": 1},                       # 1: target 1
        {"prompt": "Prove it.", "needs_flagship": 0.2},                      # 2: 0.6
        {"prompt": "say  HELLO.", "needs_flagship": 0},                      # 3: the same prompt (key): 0.5
        {"prompt": "Prove it.", "needs_flagship": 0.4},                      # 4: 0.7, agrees with line 2
        {"id": "r7", "prompt": "Translate this.", "micro": 1, "flagship": 0},  # 5: 0
        {"id": "r7", "prompt": "Translate this, please.", "needs_flagship": 1},  # 6: the same request: 1
    ])
    found = find_contradictions(rows)
    assert found.prompts == 2
    assert found.example == ((f"{path}:1", 1.0), (f"{path}:3", 0.5))
    assert found.line() == (f"2 prompts with contradicting labels (targets at least 0.5 apart), e.g. {path}:1 "
                            f"(target 1) against {path}:3 (target 0.5)")


def test_agreeing_labels_are_no_contradiction_and_linked_rows_count_once() -> None:
    rows = label_rows([{"prompt": "a", "needs_flagship": 0.1}, {"prompt": "a", "needs_flagship": 0.3},
                       {"prompt": "b", "needs_flagship": 0}])
    assert find_contradictions(rows).prompts == 0
    assert find_contradictions(rows).line() == "no prompt has contradicting labels"
    linked = label_rows([{"id": "r1", "prompt": "a", "needs_flagship": 0},
                         {"id": "r1", "prompt": "b", "needs_flagship": 1},
                         {"id": "r2", "prompt": "b", "needs_flagship": 1}, {"prompt": "a", "needs_flagship": 1}])
    found = find_contradictions(linked)
    assert found.prompts == 1 and found.example == (("row 1", 0.5), ("row 2", 1.0))


@pytest.mark.redis
def test_kept_request_tenants_reads_the_kept_prompts_owners(prefix: str) -> None:
    keys = LabelKeys(prefix)
    client = redis.Redis.from_url(SHARED_URL)
    try:
        client.hset(keys.prompt("req-1"), mapping={"text": "a", "tenant": "acme"})
        client.hset(keys.prompt("req-2"), mapping={"text": "b", "tenant": "globex"})
        client.hset(keys.feedback("req-3"), mapping={"score": "1", "tenant": "acme"})  # feedback, no kept prompt
    finally:
        client.close()
    ids = ["req-1", "req-2", "req-3", "req-404", *(f"x{i}" for i in range(600))]  # more than one batch
    assert kept_request_tenants(SHARED_URL, ids, key_prefix=prefix) == {"req-1": "acme", "req-2": "globex"}
