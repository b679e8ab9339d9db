"""A draft model must share its model's vocabulary; where both are directories here, that is checked before any
engine starts, and the problem comes with the policy's file:line."""

from __future__ import annotations

import json
from pathlib import Path

from backends.engines.draft_check import draft_problems
from backends.machine_checks import machine_problems
from policies.loader import parse_policy
from policies.schema import EngineSpec
from policies.speculative import DraftSpeculation, NgramSpeculation
from tests.policies.test_loader import GOOD


def _model(path: Path, vocab: int) -> str:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"vocab_size": vocab}))
    return str(path)


def _spec(model: str, draft: str) -> EngineSpec:
    return EngineSpec(model=model, served_name="m",
                      speculative=DraftSpeculation(method="draft", num_speculative_tokens=3, model=draft))


def test_a_draft_with_the_models_vocabulary_passes(tmp_path: Path) -> None:
    _model(tmp_path / "micro", 1024)
    _model(tmp_path / "draft", 1024)
    assert draft_problems(_spec("demo:micro", "demo:draft"), tmp_path) == []
    assert draft_problems(_spec("demo:micro", "Qwen/Qwen3-0.6B"), tmp_path) == []  # a hub id: the engine judges
    ngram = EngineSpec(model="demo:micro", served_name="m",
                       speculative=NgramSpeculation(method="ngram", num_speculative_tokens=3))
    assert draft_problems(ngram, tmp_path) == []


def test_another_vocabulary_or_an_unknown_demo_draft_is_refused(tmp_path: Path) -> None:
    big = _model(tmp_path / "smol", 49152)
    _model(tmp_path / "draft", 1024)
    (problem,) = draft_problems(_spec(big, "demo:draft"), tmp_path)
    assert "has a vocabulary of 1024 tokens" in problem and "49152" in problem and "share the model's" in problem
    (problem,) = draft_problems(_spec(big, "demo:nope"), tmp_path)
    assert "unknown demo model 'nope'" in problem


def test_machine_checks_report_it_at_the_pools_speculative_line(tmp_path: Path) -> None:
    big = _model(tmp_path / "smol", 49152)
    draft = _model(tmp_path / "d", 1024)
    text = GOOD.replace("model: demo:micro\n", f"model: {big}\n      speculative: {{method: draft, "
                        f"num_speculative_tokens: 3, model: {draft}}}\n")
    (problem,) = machine_problems(parse_policy(text, "p.yaml"))
    line = text.splitlines().index(f"      speculative: {{method: draft, num_speculative_tokens: 3, model: {draft}}}")
    assert problem.startswith(f"p.yaml:{line + 1}: pools.micro.engine.speculative") and "vocabulary" in problem
