"""`cascade router place`: a pool placed from its judged rows (the shipped map and router embedder) or a shared model;
bad rows refused with file:line and field. Synthetic rows: they test the command, not the map's quality."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.cli.main import main
from router_models.serving.placement import MIN_ROWS, Placement


def _rows(path: Path, n: int, bad: str | None = None) -> Path:
    lines = [json.dumps({"prompt": f"Question {i}: what is {i} times {i + 3}?", "quality": float(i % 3 != 0)})
             for i in range(n)]
    lines[5] = json.dumps({"messages": [{"role": "user", "content": "Summarise this paragraph."}], "quality": 0.5})
    if bad is not None:
        lines[7] = bad
    path.write_text("\n".join(lines) + "\n")
    return path


def test_place_from_outcomes_writes_a_placement_that_loads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "general.json"
    assert main(["router", "place", "--pool", "general", "--outcomes", str(_rows(tmp_path / "r.jsonl", 120)),
                 "--out", str(out)]) == 0
    placement = Placement.load(out)  # checked against the served (shipped) map
    assert placement.pool == "general" and placement.rows == 120 and placement.origin["outcomes"].endswith("r.jsonl")
    printed = capsys.readouterr().out
    assert "overall" in printed and "domain-4" in printed and "+-" in printed


@pytest.mark.parametrize(("bad", "words"), [
    ('{"prompt": "x", "quality": 1.5}', "r.jsonl:8: field 'quality' is 1.5"),
    ('{"prompt": "x"}', "r.jsonl:8: field 'quality' is None"),
    ('{"quality": 1}', "r.jsonl:8: field 'prompt'"),
    ("not json", "r.jsonl:8: not valid JSON"),
])
def test_place_refuses_a_bad_row(tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: str, words: str) -> None:
    rows = _rows(tmp_path / "r.jsonl", 120, bad)
    assert main(["router", "place", "--pool", "p", "--outcomes", str(rows), "--out", str(tmp_path / "o.json")]) == 2
    assert words in capsys.readouterr().err and not (tmp_path / "o.json").exists()


def test_place_refuses_too_few_rows_and_an_unknown_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = _rows(tmp_path / "r.jsonl", MIN_ROWS - 10)
    assert main(["router", "place", "--pool", "p", "--outcomes", str(rows), "--out", str(tmp_path / "o.json")]) == 2
    assert f"{MIN_ROWS - 10} rows, a placement needs at least {MIN_ROWS}" in capsys.readouterr().err
    assert main(["router", "place", "--pool", "p", "--shared-model", "gpt-4o", "--out", str(tmp_path / "o.json")]) == 2
    assert "zeroeval/gpt-4o-2024-08-06" in capsys.readouterr().err
