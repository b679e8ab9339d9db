"""Demo model cache: manifest checks (fast, synthetic files) and one real build (about 10-20 s)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from backends.models.demo import (
    DEMO_RECIPES,
    MANIFEST_NAME,
    _write_manifest,
    demo_model_dir,
    ensure_demo_models,
    verify_model_dir,
)

# one xdist group: under pytest-xdist the module's real build (`built`, 10-20 s) runs once, not once per worker
pytestmark = pytest.mark.xdist_group("demo-build")


def _fake_model(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text('{"a": 1}')
    (path / "model.safetensors").write_bytes(bytes(range(256)) * 10)
    _write_manifest(path, DEMO_RECIPES[0], "fp-1")
    return path


def test_verify_accepts_intact_dir(tmp_path: Path) -> None:
    model = _fake_model(tmp_path / "m")
    assert verify_model_dir(model) is None
    assert verify_model_dir(model, "fp-1") is None


def test_verify_rejects_missing_manifest(tmp_path: Path) -> None:
    model = _fake_model(tmp_path / "m")
    (model / MANIFEST_NAME).unlink()
    assert "no manifest" in (verify_model_dir(model) or "")
    assert "no manifest" in (verify_model_dir(tmp_path / "absent") or "")


def test_verify_rejects_changed_and_missing_files(tmp_path: Path) -> None:
    model = _fake_model(tmp_path / "m")
    (model / "model.safetensors").write_bytes(b"truncated")
    assert verify_model_dir(model) == "sha256 mismatch in model.safetensors"
    (model / "config.json").unlink()
    assert verify_model_dir(model) == "missing file config.json"


def test_verify_rejects_other_recipe_and_garbage_manifest(tmp_path: Path) -> None:
    model = _fake_model(tmp_path / "m")
    assert "another recipe" in (verify_model_dir(model, "fp-2") or "")
    (model / MANIFEST_NAME).write_text("{not json")
    assert "unreadable manifest" in (verify_model_dir(model) or "")


def test_demo_model_dir_is_pure_and_checks_names(tmp_path: Path) -> None:
    assert demo_model_dir(tmp_path, "micro") == tmp_path / "micro"
    assert not (tmp_path / "micro").exists()
    with pytest.raises(ValueError, match="unknown demo model 'huge'"):
        demo_model_dir(tmp_path, "huge")


def test_recipes_fit_vllm_cpu() -> None:
    for recipe in DEMO_RECIPES:
        assert recipe.head_dim % 32 == 0 and recipe.head_dim >= 32
        assert recipe.max_position_embeddings >= 2048
        assert recipe.num_heads % recipe.num_kv_heads == 0


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return ensure_demo_models(tmp_path_factory.mktemp("models"))


def _files(model: Path) -> dict[str, str]:
    files: dict[str, str] = json.loads((model / MANIFEST_NAME).read_text())["files"]
    return files


def test_build_makes_llama_and_mixtral(built: dict[str, Path]) -> None:
    micro = json.loads((built["micro"] / "config.json").read_text())
    flagship = json.loads((built["flagship"] / "config.json").read_text())
    assert micro["architectures"] == ["LlamaForCausalLM"]
    assert flagship["architectures"] == ["MixtralForCausalLM"]
    assert (flagship["num_local_experts"], flagship["num_experts_per_tok"]) == (8, 2)
    for config in (micro, flagship):
        assert config["hidden_size"] // config["num_attention_heads"] == 32 == config["head_dim"]
        assert config["max_position_embeddings"] >= 2048
        assert config["eos_token_id"] == 1
    assert (built["flagship"] / "model.safetensors").stat().st_size > 5 * (
        built["micro"] / "model.safetensors"
    ).stat().st_size


def test_tokenizer_chat_template_renders_roles_and_eos(built: dict[str, Path]) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(built["micro"]))
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello!"},
        {"role": "assistant", "content": "Hi."},
        {"role": "user", "content": "Bye."},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<s><|system|>\nBe brief.</s>\n<|user|>\nHello!</s>\n<|assistant|>\nHi.</s>\n"
        "<|user|>\nBye.</s>\n<|assistant|>\n"
    )
    assert tokenizer.eos_token == "</s>" and tokenizer.convert_tokens_to_ids("</s>") == 1
    ids = tokenizer("the capital of France")["input_ids"]
    assert tokenizer.decode(ids) == "the capital of France"


def test_cached_models_are_reused(built: dict[str, Path], caplog: pytest.LogCaptureFixture) -> None:
    before = {name: (path / "model.safetensors").stat().st_mtime_ns for name, path in built.items()}
    with caplog.at_level(logging.INFO, logger="backends.models.demo"):
        again = ensure_demo_models(built["micro"].parent)
    assert again == built
    assert {name: (path / "model.safetensors").stat().st_mtime_ns for name, path in again.items()} == before
    assert "building" not in caplog.text and "manifest verified" in caplog.text


def test_corrupt_and_partial_dirs_are_rebuilt_identically(built: dict[str, Path]) -> None:
    root = built["micro"].parent
    expected = {name: _files(path) for name, path in built.items()}
    with (built["flagship"] / "model.safetensors").open("r+b") as handle:
        handle.write(b"\x00" * 64)
    (built["micro"] / MANIFEST_NAME).unlink()  # as if a build had been interrupted
    (root / ".micro.build-leftover").mkdir()
    rebuilt = ensure_demo_models(root)
    assert {name: _files(path) for name, path in rebuilt.items()} == expected  # same bytes
    assert all(verify_model_dir(path) is None for path in rebuilt.values())
    assert not list(root.glob(".*.build-*")) and not list(root.glob(".*.old-*"))


def test_force_rebuilds(built: dict[str, Path]) -> None:
    before = (built["micro"] / "model.safetensors").stat().st_ino
    ensure_demo_models(built["micro"].parent, force=True)
    assert (built["micro"] / "model.safetensors").stat().st_ino != before
    assert verify_model_dir(built["micro"]) is None


def test_the_draft_shares_micros_tokenizer_and_is_smaller(built: dict[str, Path]) -> None:
    """vLLM compares a draft's token ids with the model's: the same tokenizer file, the same vocabulary."""
    assert (built["draft"] / "tokenizer.json").read_bytes() == (built["micro"] / "tokenizer.json").read_bytes()
    micro, draft = (json.loads((built[name] / "config.json").read_text()) for name in ("micro", "draft"))
    assert draft["vocab_size"] == micro["vocab_size"]
    assert draft["hidden_size"] < micro["hidden_size"] and draft["num_hidden_layers"] < micro["num_hidden_layers"]
