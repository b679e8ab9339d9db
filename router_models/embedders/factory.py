"""Embedders by name: `make_embedder` builds the backend a name asks for (see `protocol.parse_name`)."""

from __future__ import annotations

import logging

from router_models.embedders.concat import ConcatEmbedder, part_names
from router_models.embedders.protocol import DEFAULT_EMBEDDER, Embedder, parse_name
from router_models.embedders.torch_minilm import MiniLMEmbedder

__all__ = ["make_embedder"]

_log = logging.getLogger(__name__)


def make_embedder(name: str = DEFAULT_EMBEDDER, threads: int | None = None) -> Embedder:
    """The embedder registered under `name` (see `parse_name` for the format).

    A 'static' name builds its word-piece table on first use (about a minute, cached: `static_minilm`);
    `threads` does not apply to it (a lookup, no model call). Names joined by '+' give their vectors side by
    side (`concat.ConcatEmbedder`).

    `threads`: intra-op threads of an ONNX backend (torch's are process-wide:
    `serving.classifier_scorer.set_torch_threads`).
    An `onnx-*` name without onnxruntime installed falls back, with a logged warning, to the torch model with
    the same layers and tokens and ONNX Runtime's int8 rounding emulated (`onnx_minilm.emulate_int8`): its
    vectors match the ONNX ones, so it keeps the name and the artifact trained for it; it is only slower.
    """
    parts = part_names(name)
    if len(parts) > 1:
        return ConcatEmbedder([make_embedder(part, threads) for part in parts])
    spec = parse_name(name)
    if spec.backend == "static":
        from router_models.embedders.static_minilm import StaticMiniLMEmbedder

        return StaticMiniLMEmbedder(name, spec.layers, max_tokens=spec.max_tokens)
    alone = 1 if spec.quantize else 8  # int8 activations are quantized per call: see OnnxMiniLMEmbedder
    if spec.backend == "torch":
        return MiniLMEmbedder(name, batch_size=alone)
    try:
        from router_models.embedders.onnx_minilm import OnnxMiniLMEmbedder

        return OnnxMiniLMEmbedder(name, spec.max_tokens, spec.layers, spec.quantize, threads=threads)
    except ImportError as exc:
        _log.warning("onnxruntime unavailable (%s): embedder %s falls back to torch emulating its int8 "
                     "(equivalent vectors, slower); install onnxruntime for full speed", exc, name)
        fallback = MiniLMEmbedder(name, batch_size=alone)
        if threads is not None:
            fallback.set_threads(threads)
        return fallback
