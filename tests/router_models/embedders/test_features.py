"""Structural features: the needle pre-check and the lower-cased regex on ASCII text never change a count (the
artifact's weights were fitted on the regex counts), on real prompts, mixed-case ASCII and text built to trip case
folding."""

from __future__ import annotations

import functools
import json
import random
import re
from pathlib import Path

import pytest

from router_models.embedders.features import (
    _CODE_TOKENS,
    _COUNTERS,
    CODE_TOKENS_FITTED,
    FEATURE_NAMES,
    _Counter,
    structural_features,
)
from router_models.serving.scorer import ConversationShape, prompt_shape
from router_models.training.outcomes import DEFAULT_ROUTING_DIR, load_outcomes

ROOT = Path(__file__).resolve().parents[3]
DOTLESS_I, DOTTED_I, LONG_S, KELVIN = "\u0131", "\u0130", "\u017f", "\u212a"  # match ASCII under IGNORECASE
TRICKY = [
    "PRIME numbers: PROVE it", f"pr{DOTLESS_I}me (dotless i) and {DOTTED_I}ntegers",
    f"{LONG_S}tep by {LONG_S}tep, {LONG_S}uch that", f"{KELVIN}elvin: MUST be", "Should WE compare?",
    "in O(n log n) WITHOUT extra memory", "TL;DR: summarise", "tldr please", "CONVERT this to JSON",
    "def f():\n    return None;\n", "SELECT * FROM t;", "for (i = 0; i < n; i++) {}", "Stra\u00dfe maximum \u1e9e",
    "\ufb01nd all \ufb02ow", "\u216b \u217b \u01c5 \u01c6", "", " ", "\n\n", "hi\nhello\nthanks",
    "1. one\n2. two\n- three", "STEP-BY-STEP: Explain Why; Pros And Cons", "Hi\nHELLO\nThank You",
    "In O(N) Such That; TL;DR", "Convert THIS list To Json", "ANALYZE and Analyse, Eigenvalues CONVERGES",
    "```def f(): return self.x;```", "=>;\n#include<a>; \nfn main() {}", "xdef class_ returnNone nullable None;",
    "async await asyncawait self.self. SELECT SELECTED for (for (;;)) while(1) public struct const",
]


@functools.cache
def _texts() -> list[str]:
    lines = (ROOT / "loadtest" / "data" / "synthetic_prompts.jsonl").read_text().splitlines()
    texts = [str(json.loads(line)["prompt"]) for line in lines]
    if DEFAULT_ROUTING_DIR.is_dir():
        texts += [ex.text for ex in load_outcomes(DEFAULT_ROUTING_DIR, max_per_source=400)]  # 2,800 real prompts
    rng = random.Random(7)
    alphabet = ("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ ;()_{}\n0123456789.?!-"
                + DOTLESS_I + DOTTED_I + LONG_S + KELVIN + "\u00df\u1e9e\ufb01")
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 300))) for _ in range(2000)]
    # ASCII in mixed case (the lower-cased regex's texts): every real prompt shouted, swapped, title-cased
    real = [t for t in texts if t.isascii()][:1500]
    texts += [t.upper() for t in real] + [t.swapcase() for t in real] + [t.title() for t in real]
    return TRICKY + texts


@pytest.mark.parametrize(("name", "counter"), _COUNTERS, ids=[name for name, _ in _COUNTERS])
def test_the_needle_check_gives_the_regex_counts(name: str, counter: _Counter) -> None:
    wrong = [t for t in _texts() if counter(t) != len(counter.regex.findall(t))]
    assert not wrong, f"{name}: {len(wrong)} texts counted differently, e.g. {wrong[0][:200]!r}"


def test_the_code_cues_count_as_the_pattern_the_artifacts_were_fitted_on() -> None:
    fitted = re.compile(CODE_TOKENS_FITTED, re.MULTILINE)
    wrong = [t for t in _texts() if len(_CODE_TOKENS.regex.findall(t)) != len(fitted.findall(t))]
    assert not wrong, f"{len(wrong)} texts counted differently, e.g. {wrong[0][:200]!r}"


def test_features_have_their_names_and_shape() -> None:
    rows = structural_features(TRICKY)
    assert rows.shape == (len(TRICKY), len(FEATURE_NAMES)) and (rows >= 0).all()


def test_a_conversation_and_its_latest_turn_alone_give_different_rows() -> None:
    """The same scoring text read as a plain prompt and as the latest turn of a long conversation: the text columns
    agree, the shape columns do not (turns, the whole length)."""
    text = "Now make it shorter."
    long_chat = ConversationShape(user_turns=6, assistant_turns=5, total_chars=9000, latest_chars=len(text))
    plain, chat = structural_features([text, text], [None, long_chat])
    shape_cols = [FEATURE_NAMES.index(n) for n in ("user_turns", "assistant_turns", "conversation_chars")]
    text_cols = [i for i in range(len(FEATURE_NAMES)) if FEATURE_NAMES[i] in FEATURE_NAMES[:16]]
    assert (plain[text_cols] == chat[text_cols]).all()
    assert all(chat[i] > plain[i] for i in shape_cols)
    assert (structural_features([text])[0] == structural_features([text], [prompt_shape(text)])[0]).all()
    with pytest.raises(ValueError, match="1 texts but 2 shapes"):
        structural_features([text], [None, None])


def test_the_word_lists_read_ascii_lower_cased() -> None:
    """The case-insensitive word lists take the lower-cased path on ASCII text (else the test above proves nothing
    about it)."""
    lowered = [name for name, counter in _COUNTERS if counter._lowered is not None]
    assert {"math_words", "reasoning_cues", "constraint_cues", "light_task_cues", "chitchat"} <= set(lowered)
