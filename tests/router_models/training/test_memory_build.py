"""`cascade router memory add`: label rows become a verified memory file that grows with each call, conflicting
labels of one prompt are counted, and a bad row is refused with its line number before anything is written.
The label rows are written here: they test the plumbing, never what labels buy (the learning curve does)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from router_models.cli import register
from router_models.serving.artifact import DEFAULT_ARTIFACT, load_artifact
from router_models.serving.memory_file import load_memory


def _run(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["router", "memory", "add", *argv])
    return int(args.func(args))


def _labels(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_labels_are_appended_to_the_tenants_memory_and_conflicts_counted(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "store"
    first = _labels(tmp_path / "a.jsonl", [{"prompt": "Prove that the square root of two is irrational.",
                                            "needs_flagship": 1},
                                           {"prompt": "Say hello.", "micro": 1.0, "flagship": 0.5}])
    again = _labels(tmp_path / "b.jsonl", [{"prompt": "Say hello.", "needs_flagship": 1}])
    common = ("--tenant", "acme", "--store", str(store), "--artifact", str(DEFAULT_ARTIFACT))
    assert _run("--labels", str(first), *common) == 0
    assert _run("--labels", str(again), *common) == 0
    memory, meta = load_memory(store / "memory" / "acme.json", embedder=load_artifact(DEFAULT_ARTIFACT).embedder)
    assert len(memory) == 3 and meta["conflicting_prompts"] == 1  # "Say hello.": targets 0.25, then 1.0
    assert memory.targets.tolist() == [1.0, 0.25, 1.0]
    assert "2 -> 3 labels, 1 prompts with conflicting labels" in capsys.readouterr().out


def test_a_bad_row_is_refused_with_its_line_and_nothing_is_written(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    bad = _labels(tmp_path / "bad.jsonl", [{"prompt": "Say hello.", "needs_flagship": 0},
                                           {"prompt": "Say goodbye.", "needs_flagship": 7}])
    assert _run("--labels", str(bad), "--store", str(tmp_path / "store")) == 2
    assert f"{bad}:2" in capsys.readouterr().err
    assert not (tmp_path / "store" / "memory").exists()
    assert _run("--labels", str(bad), "--tenant", "a:b", "--store", str(tmp_path / "store")) == 2
