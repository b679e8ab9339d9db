"""Side-by-side embedders: rows are the parts' vectors in the order named, and training caches each part."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from router_models.embedders.concat import ConcatEmbedder, part_names
from router_models.embedders.disk_cache import embed_cached


class Fake:
    """A part that counts the texts it was asked to embed."""

    def __init__(self, name: str, value: float, dim: int) -> None:
        self.name, self.dim, self.cache_tag, self.value = name, dim, f"tag-{name}", value
        self.calls = 0

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        self.calls += len(texts)
        return np.asarray([[self.value * len(t)] * self.dim for t in texts], dtype=np.float32)


def test_names_split_on_plus() -> None:
    assert part_names("a:static") == ["a:static"]
    assert part_names("a:static+a:onnx-int8:t32:l3") == ["a:static", "a:onnx-int8:t32:l3"]
    with pytest.raises(ValueError, match="empty part"):
        part_names("a:static+")
    with pytest.raises(ValueError, match="two"):
        ConcatEmbedder([Fake("a", 1.0, 2)])


def test_rows_are_the_parts_side_by_side() -> None:
    both = ConcatEmbedder([Fake("a", 1.0, 2), Fake("b", -1.0, 3)])
    assert (both.name, both.dim) == ("a+b", 5)
    assert both.embed(["xy", "z"]).tolist() == [[2, 2, -2, -2, -2], [1, 1, -1, -1, -1]]


def test_training_cache_keeps_each_part_under_its_own_name(tmp_path: Path) -> None:
    a, b = Fake("a", 1.0, 2), Fake("b", 2.0, 1)
    first = embed_cached(ConcatEmbedder([a, b]), ["p", "qq"], tmp_path)
    assert sorted(p.name for p in tmp_path.glob("*.npz")) == ["a_tag-a.npz", "b_tag-b.npz"]
    c = Fake("c", 3.0, 1)
    again = embed_cached(ConcatEmbedder([a, c]), ["p", "qq"], tmp_path)  # part a comes from its cache
    assert a.calls == 2 and c.calls == 2
    assert np.array_equal(again[:, :2], first[:, :2]) and again[:, 2].tolist() == [3.0, 6.0]
