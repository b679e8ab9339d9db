"""The ONNX Runtime embedder: equivalent to the torch model, exported once and reused, and a fallback."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from router_models.embedders import onnx_minilm as embedder_onnx
from router_models.embedders.factory import make_embedder
from router_models.embedders.onnx_minilm import OnnxMiniLMEmbedder, default_cache_dir, length_buckets
from router_models.embedders.protocol import parse_name
from router_models.embedders.torch_minilm import MiniLMEmbedder

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("onnxruntime")

# one xdist group: under pytest-xdist the module's fresh ONNX export (`onnx_embedder`) is made once
pytestmark = pytest.mark.xdist_group("onnx-export")
NAME = "all-MiniLM-L6-v2:onnx-int8:t64:l3"
TEXTS = [
    "hi there!",
    "",
    "Translate to French: good morning",
    "Prove that there are infinitely many primes p such that p + 2 is not prime, and give a rigorous argument. "
    "Then generalise the argument to arithmetic progressions and discuss where it breaks down, step by step, "
    "with every lemma stated and proved; this prompt is long enough to be truncated at 64 word pieces.",
    "def f(x):\n    return x ** 2  # what does this return for x = 3?",
]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("router-cache")


@pytest.fixture(scope="module")
def onnx_embedder(cache: Path) -> OnnxMiniLMEmbedder:
    return OnnxMiniLMEmbedder(NAME, 64, 3, True, threads=1, cache_dir=cache)


@pytest.fixture(scope="module")
def torch_fp32() -> MiniLMEmbedder:
    return MiniLMEmbedder("all-MiniLM-L6-v2:fp32:t64:l3")


def test_names_parse() -> None:
    spec = parse_name(NAME)
    assert (spec.backend, spec.quantize, spec.max_tokens, spec.layers) == ("onnx", True, 64, 3)
    assert parse_name("all-MiniLM-L6-v2:int8:t64:l3").backend == "torch"
    with pytest.raises(ValueError, match="onnx-int8"):
        parse_name("all-MiniLM-L6-v2:onnx-int4:t64")


def test_vectors_match_the_torch_model(onnx_embedder: OnnxMiniLMEmbedder, torch_fp32: MiniLMEmbedder) -> None:
    ours, ref = onnx_embedder.embed(TEXTS), torch_fp32.embed(TEXTS)
    assert ours.shape == (len(TEXTS), 384) and ours.dtype == np.float32
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-4)
    cosine = (ours * ref).sum(axis=1)
    assert cosine.min() > 0.98, cosine  # int8 noise only (measured mean ~0.996 on 200 realistic prompts)
    assert np.allclose(onnx_embedder.embed(TEXTS[::-1])[::-1], ours, atol=1e-5)  # order-independent


def test_length_buckets_limit_padding_and_size() -> None:
    assert length_buckets([], 8) == []
    assert length_buckets([10], 8) == [[0]]
    assert length_buckets([5, 50, 6, 7, 48, 60], 8) == [[0, 2, 3], [4, 1, 5]]
    assert length_buckets([20] * 10, 8) == [list(range(8)), [8, 9]]


def test_export_is_cached_and_reused(
    onnx_embedder: OnnxMiniLMEmbedder, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert onnx_embedder.model_path.parent == cache / "onnx"
    assert [p.name for p in (cache / "onnx").iterdir()] == [onnx_embedder.model_path.name]  # no temp files left

    def no_export(*_: object) -> None:
        raise AssertionError("exported again instead of reusing the cache")

    monkeypatch.setattr(embedder_onnx, "_export_fp32", no_export)
    again = OnnxMiniLMEmbedder(NAME, 64, 3, True, threads=1, cache_dir=cache)
    assert again.model_path == onnx_embedder.model_path
    assert again.cache_tag.startswith(again.model_path.stem)  # training's embedding cache follows the graph
    assert np.allclose(again.embed(TEXTS[:2]), onnx_embedder.embed(TEXTS[:2]), atol=1e-6)


def test_cache_dir_follows_cascade_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / "router-cache"
    monkeypatch.delenv("CASCADE_HOME")
    assert default_cache_dir() == Path(".cascade").resolve() / "router-cache"


def test_falls_back_to_torch_without_onnxruntime(
    onnx_embedder: OnnxMiniLMEmbedder, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` now raises ImportError
    with caplog.at_level(logging.WARNING, logger="router_models.embedders.factory"):
        fallback = make_embedder(NAME, threads=1)
    assert isinstance(fallback, MiniLMEmbedder)
    assert fallback.name == NAME
    assert "falls back to torch" in caplog.text
    cosine = (fallback.embed(TEXTS) * onnx_embedder.embed(TEXTS)).sum(axis=1)
    assert cosine.min() > 0.99, cosine  # same rounding; only the batching differs (measured mean 0.998)


def test_training_cache_is_keyed_by_the_graph(tmp_path: Path) -> None:
    from router_models.embedders.disk_cache import embed_cached

    class Fake:
        name, dim, cache_tag = "fake:onnx", 3, "graph-abc"

        def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
            return np.ones((len(texts), 3), dtype=np.float32)

    assert embed_cached(Fake(), ["a", "b"], tmp_path).shape == (2, 3)
    assert sorted(p.name for p in tmp_path.glob("*.npz")) == ["fake_onnx_graph-abc.npz"]


def test_concurrent_calls_give_the_serial_vectors(onnx_embedder: OnnxMiniLMEmbedder) -> None:
    from concurrent.futures import ThreadPoolExecutor

    serial = [onnx_embedder.embed([t]) for t in TEXTS * 4]
    with ThreadPoolExecutor(max_workers=3) as pool:  # the scorer's workers share one session
        parallel = list(pool.map(lambda t: onnx_embedder.embed([t]), TEXTS * 4))
    assert all(np.array_equal(a, b) for a, b in zip(serial, parallel, strict=True))


def test_an_int8_vector_does_not_depend_on_the_texts_beside_it(onnx_embedder: OnnxMiniLMEmbedder) -> None:
    """int8 activations are quantized per call: each text runs alone, so a batch changes nothing."""
    texts = ["hi", "Prove that every bounded monotone sequence of reals converges, step by step.", "a b c"]
    together = onnx_embedder.embed(texts)
    for i, text in enumerate(texts):
        assert np.array_equal(onnx_embedder.embed([text])[0], together[i])
