"""What an embedder is, and how one is named: text in, fixed-size float32 vectors out.

`Embedder` is the one seam between the classifier and the model that turns text into vectors, so an ONNX or
other backend can replace the torch one where it measures faster. An artifact records the `name` of the
embedder it was trained with; a scorer refuses to pair it with a different one (see `serving/artifact.py`).

Embedders are synchronous and CPU-bound: call them from a worker thread, never from the event loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

__all__ = ["DEFAULT_EMBEDDER", "Embedder", "EmbedderSpec", "FloatArray", "parse_name"]

FloatArray = npt.NDArray[np.float32]

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
          "'all-MiniLM-L6-v2:static[:t<max tokens>][:l<1-6 layers>]'")


def parse_name(name: str) -> EmbedderSpec:
    """An embedder name -> `EmbedderSpec`. Two forms:

    - 'all-MiniLM-L6-v2:<int8|fp32|onnx-int8|onnx-fp32>:t<max tokens>[:l<layers>]': the transformer, its
      lower `layers` (default 6) over the first `max tokens` word pieces;
    - 'all-MiniLM-L6-v2:static[:t<max tokens>][:l<layers>]': the static word-piece table distilled from those
      layers (`static_minilm`), over the first `max tokens` word pieces (none given, or t0: the whole text).
    """
    try:
        model, precision, *rest = name.split(":")
        if model != "all-MiniLM-L6-v2":
            raise ValueError(name)
        if precision == "static":
            tokens, rest = (rest[0], rest[1:]) if rest and rest[0].startswith("t") else ("t0", rest)
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
