"""Side-by-side embedders: one vector per text made of several embedders' vectors, concatenated.

Named by joining its parts' names with '+' (e.g. 'all-MiniLM-L6-v2:static+all-MiniLM-L6-v2:onnx-int8:t32:l3'):
each part embeds the same texts, the rows are stacked side by side in the order named. Training's vector
cache (`disk_cache`) keeps each part's vectors under the part's own name, so a part already embedded for
another run is not embedded again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from router_models.embedders.protocol import Embedder

__all__ = ["SEPARATOR", "ConcatEmbedder", "part_names"]

FloatArray = npt.NDArray[np.float32]
SEPARATOR = "+"


def part_names(name: str) -> list[str]:
    """The embedder names a (possibly concatenated) name is made of, in order; a plain name is its own part."""
    parts = name.split(SEPARATOR)
    if any(not p for p in parts):
        raise ValueError(f"unknown embedder {name!r}: empty part in a '{SEPARATOR}'-joined name")
    return parts


class ConcatEmbedder:
    """`Embedder` whose row i is [part_1(texts[i]), part_2(texts[i]), ...]. Thread-safe when its parts are;
    a text's vector depends on the texts beside it only as much as a part's does."""

    def __init__(self, parts: Sequence[Embedder]) -> None:
        if len(parts) < 2:
            raise ValueError("a concatenation needs at least two embedders")
        self.parts = tuple(parts)
        self.name = SEPARATOR.join(p.name for p in self.parts)
        self.dim = sum(p.dim for p in self.parts)

    def embed(self, texts: Sequence[str]) -> FloatArray:
        return np.hstack([p.embed(texts) for p in self.parts]).astype(np.float32)
