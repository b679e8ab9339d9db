"""A prompt's first word pieces, as the MiniLM tokenizer gives them, read word by word with the words' pieces kept.

The `tokenizers` library took 120-150 us of CPU for a real prompt of ~190 characters on a 2-core Xeon (the bench's
prompts cut at 512 characters, one thread); the embedders read 64 of its word pieces. For the text most prompts
are, the same pieces come from three rules of the uncased BERT tokenizer, at ~27 us a prompt:
- normalising: ASCII is lower-cased (accents, Chinese characters and control characters do not occur; a text with an
  ASCII control character other than tab, newline and carriage return, which the normaliser deletes, is not read
  here);
- pre-tokenizing: runs of letters and digits are words, every other printable ASCII character a word of its own,
  whitespace separates;
- WordPiece: each word alone, greedy longest match (`tokenizers`' own `WordPiece.tokenize`, whose pieces are kept
  per word, up to `_CACHE_WORDS` words: a prompt's words are mostly the words earlier prompts had).
`WordPieces.first` reads a long text only as far as the cut needs (`word_prefix`), and words only until it has the
pieces asked for. Any other text (non-ASCII, a control character, an added token such as "[SEP]" spelt out, which
the tokenizer reads as that token) goes to the tokenizer itself; so does every text of a tokenizer that is not the
uncased BERT one. tests/router_models/embedders/test_word_pieces.py holds both paths equal to the tokenizer's
whole-text pieces on real prompts of every shared source, random ASCII and made-up hard cases.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

__all__ = ["WordPieces", "readable", "word_pieces_of", "word_prefix"]

_WORD = re.compile(r"[a-z0-9]+|[^a-z0-9\s]")
_DELETED = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")  # ASCII control characters the normaliser deletes
_CACHE_WORDS = 100_000  # words whose pieces are kept (about 16 MB at most); past it the cache starts again


class WordPieces:
    """A tokenizer's word pieces without special tokens (module docstring). Thread-safe: the cache is a dict whose
    entries are written whole."""

    def __init__(self, tokenizer: Any, probe_chars_per_piece: int = 8) -> None:
        self.tokenizer = tokenizer
        self._chars_per_piece = probe_chars_per_piece
        self._fast = _is_uncased_bert(tokenizer)
        self._added = tuple(t.content for t in tokenizer.get_added_tokens_decoder().values())
        self._words: dict[str, tuple[int, ...]] = {}

    def first(self, text: str, limit: int) -> tuple[list[int], bool]:
        """The first `limit` word pieces of `text` (0: all), as `tokenizer.encode(text, add_special_tokens=False)`
        gives them, and whether the text has more than `limit`; a lone surrogate is read as "?" (`readable`). A long
        text is first read up to a space or newline past `limit` pieces' worth of characters (`word_prefix`: the words
        before a whitespace are read as in the whole text), and whole only when that prefix has no more than
        `limit`."""
        if limit:
            head = word_prefix(text, self._chars_per_piece * limit)
            if len(head) < len(text):
                ids, more = self._read(head, limit)
                if more:
                    return ids, more
        return self._read(text, limit)

    def _read(self, text: str, limit: int) -> tuple[list[int], bool]:
        if self._fast and text.isascii() and not _DELETED.search(text) and not self._spells_added(text):
            return self._read_ascii(text, limit)
        # `encode_batch_fast`: the same pieces as `encode` without the offsets nothing here reads (15% less CPU);
        # `readable`: ASCII always encodes, another text may carry a lone surrogate the tokenizer would fail on
        ids = self.tokenizer.encode_batch_fast([readable(text)], add_special_tokens=False)[0].ids
        return (ids[:limit], True) if limit and len(ids) > limit else (ids, False)

    def _spells_added(self, text: str) -> bool:
        return "[" in text and any(token in text for token in self._added)

    def _read_ascii(self, text: str, limit: int) -> tuple[list[int], bool]:
        pieces: list[int] = []
        words = self._words
        for match in _WORD.finditer(text.lower()):
            word = match.group()
            ids = words.get(word)
            if ids is None:
                ids = tuple(token.id for token in self.tokenizer.model.tokenize(word))
                if len(words) >= _CACHE_WORDS:
                    words.clear()
                words[word] = ids
            pieces.extend(ids)
            if limit and len(pieces) > limit:
                return pieces[:limit], True
        return pieces, False


@functools.lru_cache(maxsize=4)
def word_pieces_of(tokenizer_file: Path) -> WordPieces:
    """The `WordPieces` of the tokenizer in `tokenizer_file` (no truncation, no padding), one per file in the process:
    the static and the ONNX embedder of one model read words through the same kept pieces."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return WordPieces(tokenizer)


def _is_uncased_bert(tokenizer: Any) -> bool:
    """Whether `tokenizer` normalises, splits and pieces words as the fast path reads ASCII (module docstring)."""
    from tokenizers import models, normalizers, pre_tokenizers

    norm, model = tokenizer.normalizer, tokenizer.model
    return (isinstance(norm, normalizers.BertNormalizer) and norm.lowercase and norm.clean_text
            and norm.strip_accents in (None, True)
            and isinstance(tokenizer.pre_tokenizer, pre_tokenizers.BertPreTokenizer)
            and isinstance(model, models.WordPiece) and model.continuing_subword_prefix == "##")


def word_prefix(text: str, chars: int) -> str:
    """`text` up to the first space or newline at or after `chars` characters (the whole text when it has none
    there). Its word pieces are the first ones of the whole text's: the normaliser works per character and the
    pre-tokenizer splits at whitespace, so the words before a space are tokenized as in the whole text
    (tests/router_models/embedders/test_onnx_bad_input.py holds them equal on hard and real texts)."""
    if len(text) <= chars:
        return text
    ends = [i for i in (text.find(" ", chars), text.find("\n", chars)) if i > 0]
    return text[: min(ends)] if ends else text


def readable(text: str) -> str:
    """`text` as the tokenizer can read it: lone surrogates (a JSON string may carry "\\udc80") replaced by "?",
    where the tokenizer would raise for the text and fail every text in its batch."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text
