"""A pool's `speculative` block as vLLM's `--speculative-config`: every field written out, a demo draft resolved
to its directory, nothing built."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backends.engines.args import engine_command, speculative_config
from policies.schema import EngineSpec
from policies.speculative import DraftSpeculation, NgramSpeculation


def _flag(cmd: list[str]) -> dict[str, object]:
    assert cmd.count("--speculative-config") == 1
    config: dict[str, object] = json.loads(cmd[cmd.index("--speculative-config") + 1])
    return config


def test_ngram_renders_its_window_so_vllms_defaults_never_decide() -> None:
    spec = EngineSpec(model="/m", served_name="m", speculative=NgramSpeculation(
        method="ngram", num_speculative_tokens=3, prompt_lookup_min=1, prompt_lookup_max=5))
    assert _flag(engine_command(spec, 8000)) == {
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 5}


def test_a_demo_draft_becomes_its_directory_and_is_not_built(tmp_path: Path) -> None:
    spec = EngineSpec(model="demo:micro", served_name="micro", speculative=DraftSpeculation(
        method="draft", num_speculative_tokens=2, model="demo:draft"))
    assert _flag(engine_command(spec, 8000, tmp_path)) == {
        "method": "draft_model", "num_speculative_tokens": 2, "model": str(tmp_path / "draft")}
    assert not (tmp_path / "draft").exists()
    hub = DraftSpeculation(method="draft", num_speculative_tokens=4, model="Qwen/Qwen3-0.6B")
    assert speculative_config(hub)["model"] == "Qwen/Qwen3-0.6B"


def test_no_speculation_no_flag_and_an_unknown_demo_draft_is_refused(tmp_path: Path) -> None:
    assert "--speculative-config" not in engine_command(EngineSpec(model="/m", served_name="m"), 8000)
    bad = DraftSpeculation(method="draft", num_speculative_tokens=2, model="demo:tiny-draft")
    with pytest.raises(ValueError, match="unknown demo model 'tiny-draft'"):
        speculative_config(bad, tmp_path)
