"""`cascade router score`: order kept, bad lines reported by number and skipped, pools by threshold."""

from __future__ import annotations

import argparse
import io
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from router_models.cli import register
from router_models.serving.domain import DomainReference
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
    assert json.loads(out.read_text()) == {"id": 1, "score": 0.25, "pool": "small", "in_domain": None}


class EmbeddingFake:
    """A model that gives embeddings: a prompt mentioning "exam" points one way, anything else the other."""

    embedder_name = "fake"

    def __call__(self, texts: Sequence[str], shapes: Sequence[ConversationShape] | None = None) -> list[float]:
        return self.score_and_embed(texts, shapes)[0]

    def score_and_embed(self, texts: Sequence[str], shapes: Sequence[ConversationShape] | None = None
                        ) -> tuple[list[float], np.ndarray]:
        vectors = np.array([[1.0, 0.0] if "exam" in t else [0.0, 1.0] for t in texts], np.float32)
        return fake_model(texts), vectors


def test_in_domain_written_per_row_from_the_models_embeddings(tmp_path: Path) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text('{"id": 1, "prompt": "an exam question"}\n{"id": 2, "prompt": "small talk"}\n')
    domain = DomainReference(np.array([[1.0, 0.0]], np.float16), 1, (0.0, 1.0), (0.0, 1.0))
    err = io.StringIO()
    code = score_file(inp, out, None, 0.5, ("micro", "flagship"), 1, model=EmbeddingFake(), err=err, domain=domain)
    assert code == 0 and err.getvalue() == ""
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["in_domain"] for r in rows] == [1.0, 0.0]  # cosine 1 -> the top level, cosine 0 -> the bottom


def test_no_reference_says_so_once(tmp_path: Path) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text('{"id": 1, "prompt": "a"}\n{"id": 2, "prompt": "b"}\n')
    err = io.StringIO()
    score_file(inp, out, None, 0.5, ("micro", "flagship"), 64, model=EmbeddingFake(), err=err)
    assert err.getvalue().count("in_domain: null") == 1 and "cascade router domain build" in err.getvalue()
    assert all(json.loads(line)["in_domain"] is None for line in out.read_text().splitlines())


def test_cli_registers_router_subcommands() -> None:
    parser = argparse.ArgumentParser(prog="cascade")
    register(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(["router", "score", "--in", "a.jsonl", "--out", "b.jsonl", "--threshold", "0.7"])
    assert callable(args.func)
    assert (args.threshold, args.micro_pool, args.flagship_pool) == (0.7, "micro", "flagship")
