"""`cascade router score`: order kept, bad lines reported by number and skipped, pools by threshold."""

from __future__ import annotations

import argparse
import io
import json
from collections.abc import Sequence
from pathlib import Path

from router_models.cli import register
from router_models.serving.score_file import score_file
from router_models.serving.scorer import ConversationShape

LINES = [
    '{"id": 1, "prompt": "hi"}',
    "not json at all",
    '{"id": "b", "messages": [{"role": "system", "content": "be brief"}, '
    '{"role": "user", "content": "a much longer prompt here"}]}',
    "",
    '{"prompt": "no id"}',
    '{"id": 3, "messages": "oops"}',
    '{"id": 4, "prompt": "four words right here"}',
]


def fake_model(texts: Sequence[str], shapes: Sequence[ConversationShape] | None = None) -> list[float]:
    return [min(1.0, len(t.split()) / 8) for t in texts]


def test_bad_lines_skipped_with_line_numbers(tmp_path: Path) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("\n".join(LINES) + "\n")
    err = io.StringIO()
    code = score_file(inp, out, None, 0.5, ("micro", "flagship"), 2, model=fake_model, err=err)
    assert code == 1
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == [1, "b", 4]
    assert [r["pool"] for r in rows] == ["micro", "flagship", "flagship"]
    assert rows[0]["score"] == 0.125
    messages = err.getvalue()
    assert "line 2: skipped: not valid JSON" in messages
    assert 'line 5: skipped: expected an object with an "id"' in messages
    assert "line 6: skipped" in messages
    assert "line 4" not in messages  # blank lines are ignored, not errors
    assert "3 bad line(s)" in messages


def test_clean_file_exits_zero(tmp_path: Path) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text('{"id": 1, "prompt": "hello there"}\n')
    code = score_file(inp, out, None, 0.9, ("small", "big"), 64, model=fake_model, err=io.StringIO())
    assert code == 0
    assert json.loads(out.read_text()) == {"id": 1, "score": 0.25, "pool": "small"}


def test_cli_registers_router_subcommands() -> None:
    parser = argparse.ArgumentParser(prog="cascade")
    register(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(["router", "score", "--in", "a.jsonl", "--out", "b.jsonl", "--threshold", "0.7"])
    assert callable(args.func)
    assert (args.threshold, args.micro_pool, args.flagship_pool) == (0.7, "micro", "flagship")
