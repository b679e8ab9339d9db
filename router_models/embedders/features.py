"""Cheap structural features of a prompt, computed beside its embedding.

An embedding says what a prompt is about; these say how much work it asks for: its length, code, math
notation, multi-step and constraint cues, and cues of the light task kinds (classify, extract, summarise,
greet). The last columns read the conversation's shape (`router_models.embedders.conversation.ConversationShape`): its
user, assistant and tool turns, a system prompt, its whole length and its latest user turn's, uncut, which the
scoring text (at most 2,000 characters, the latest turn first) and the embedder (its first 64 word pieces) cannot
show. Each is a small count squashed with log1p so no single long prompt dominates. Bump `FEATURE_VERSION`
whenever names, order or definitions change: artifacts trained on another version are refused at load time.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from router_models.embedders.conversation import ConversationShape, prompt_shape

__all__ = ["CODE_TOKENS_FITTED", "FEATURE_NAMES", "FEATURE_VERSION", "structural_features"]

FEATURE_VERSION = 2  # 2: the conversation-shape columns

_I = re.IGNORECASE


# Characters that match an ASCII letter under re.IGNORECASE but do not casefold to it (dotless i, dotted I,
# long s, Kelvin sign): mapped to that letter before the needle check, so the check never misses a match.
_FOLD_EXTRA = str.maketrans({"\u0131": "i", "\u0130": "i", "\u017f": "s", "\u212a": "k"})


class _Counter:
    """Count of a pattern's matches in a text. `needles`: literal pieces one of which every match contains
    (casefolded for an IGNORECASE pattern); a text holding none of them counts 0 without running the regex (the
    word-list patterns cost ~30-180 us per prompt, the substring tests a few).

    An IGNORECASE pattern written in lower case reads an ASCII text through `_lowered`: the same pattern without
    IGNORECASE on the lower-cased text. On ASCII text that is the same match at every position (a character of it
    matches an ASCII letter or class under IGNORECASE exactly when its lower case matches it; lower-casing ASCII keeps
    the length, the word characters and the line ends), and about 4x faster: `re` checks an alternative's first
    literal before entering it only when the match is case-sensitive. Any other text runs `regex` itself. `regex`
    alone gives the same counts: tests/router_models/embedders/test_features.py holds them equal on real prompts,
    mixed-case ASCII and tricky case folds."""

    def __init__(self, pattern: str, flags: int = 0, needles: tuple[str, ...] = ()) -> None:
        self.regex = re.compile(pattern, flags)
        self._folded = bool(flags & re.IGNORECASE)
        self._needles = tuple(n.casefold() for n in needles) if self._folded else needles
        self._lowered = (re.compile(pattern, flags & ~re.IGNORECASE)
                         if self._folded and pattern == pattern.lower() else None)

    def __call__(self, text: str, folded: str | None = None) -> int:
        """Matches in `text`; `folded`: `fold(text)` when the caller has it (several counters share one)."""
        if self._needles:
            haystack = (folded if folded is not None else fold(text)) if self._folded else text
            if not any(needle in haystack for needle in self._needles):
                return 0
        if self._lowered is not None and text.isascii():  # `fold` of ASCII text is its lower case
            return len(self._lowered.findall(folded if folded is not None else text.lower()))
        return len(self.regex.findall(text))





def fold(text: str) -> str:
    """`text` as an IGNORECASE counter's needles are looked for in it (casefolded, `_FOLD_EXTRA` mapped)."""
    return text.casefold().translate(_FOLD_EXTRA)


# The code cues, each word's `\b` taken out in front of one group: `re` tests an alternative's first literal before
# entering it, which an alternative that starts with `\b` defeats (75 against 9.6 us a real prompt the needles let
# through). No two cues can match at one position (their first characters differ, or they are words none of which
# begins another), so the order does not pick another match: the same count as the pattern the artifacts were fitted
# on, `CODE_TOKENS_FITTED` (tests/router_models/embedders/test_features.py holds them equal).
CODE_TOKENS_FITTED = (
    r"```|\bdef |\bclass |\breturn\b|\bimport |\bfunction\b|=>|\bconst |\bpublic |\bstruct |#include|"
    r"\bSELECT\b|\bfn |\bfor \(|\bwhile\b|\basync\b|\bawait\b|\bself\.|\bnull\b|\bNone\b|;\s*$")
_CODE_TOKENS = _Counter(
    r"```|=>|#include|;\s*$|\b(?:def |class |return\b|import |function\b|const |public |struct |SELECT\b|fn |"
    r"for \(|while\b|async\b|await\b|self\.|null\b|None\b)",
    re.MULTILINE,
    needles=("```", "def ", "class ", "return", "import ", "function", "=>", "const ", "public ", "struct ",
             "#include", "SELECT", "fn ", "for (", "while", "async", "await", "self.", "null", "None", ";"),
)
_CODE_CHARS = _Counter(r"[{}\[\]();=<>_]")
_MATH_SYMBOLS = _Counter(r"[+\-*/^=<>≤≥∑∫√π]|\\(frac|sum|int|sqrt|prod|binom|le|ge|cdot)")
_NUMBERS = _Counter(r"\d+(?:\.\d+)?")
_MATH_WORDS = _Counter(
    r"\b(prove|proof|theorem|lemma|integer|integers|prime|divisible|polynomial|equation|inequality|"
    r"integral|derivative|probability|expected value|modulo|matrix|eigen\w*|sequence|converge\w*|"
    r"real numbers|positive integers|find all|how many ways|maximum|minimum|remainder)\b",
    _I,
    needles=("prove", "proof", "theorem", "lemma", "integer", "prime", "divisible", "polynomial", "equation",
             "inequality", "integral", "derivative", "probability", "expected value", "modulo", "matrix", "eigen",
             "sequence", "converge", "real numbers", "positive integers", "find all", "how many ways", "maximum",
             "minimum", "remainder"),
)
_REASONING = _Counter(
    r"\b(step[- ]by[- ]step|explain why|why does|justify|derive|analy[sz]e|trade-?offs?|compare|"
    r"evaluate|design|architect\w*|optimi[sz]e|strategy|plan|debug|refactor|implement|reason|pros and cons|"
    r"consider|recommend|should (i|we)|whether|implications?|edge cases?|complexity|concurren\w*|"
    r"scal\w+|race condition|deadlock|migrat\w+|root cause)\b",
    _I,
    needles=("step", "explain why", "why does", "justify", "derive", "analy", "trade", "compare", "evaluate",
             "design", "architect", "optimi", "strategy", "plan", "debug", "refactor", "implement", "reason",
             "pros and cons", "consider", "recommend", "should ", "whether", "implication", "edge case",
             "complexity", "concurren", "scal", "race condition", "deadlock", "migrat", "root cause"),
)
_CONSTRAINTS = _Counter(
    r"\b(must|without|at most|at least|exactly|ensure|constraints?|requirements?|given that|assume|"
    r"such that|unless|except|while also|in o\(|budget|deadline)\b",
    _I,
    needles=("must", "without", "at most", "at least", "exactly", "ensure", "constraint", "requirement",
             "given that", "assume", "such that", "unless", "except", "while also", "in o(", "budget", "deadline"),
)
_LIGHT_TASK = _Counter(
    r"\b(classify|categori[sz]e|label|sentiment|extract|pull out|list the|summari[sz]e|tl;?dr|"
    r"translate|rephrase|reword|fix the typo|spell|capital of|what time|define|synonym|one word|"
    r"yes or no|true or false|format (this|as)|convert .{0,20} to json|as json|in json)\b",
    _I,
    needles=("classify", "categori", "label", "sentiment", "extract", "pull out", "list the", "summari", "tl",
             "translate", "rephrase", "reword", "fix the typo", "spell", "capital of", "what time", "define",
             "synonym", "one word", "yes or no", "true or false", "format ", "convert", "as json", "in json"),
)
_CHITCHAT = _Counter(
    r"^\s*(hi|hello|hey|thanks|thank you|good (morning|evening|night)|how are you|what's up|lol|ok|"
    r"cool|nice|bye)\b",
    _I | re.MULTILINE,
)
_ENUMERATION = _Counter(r"^\s*(?:\d+[.)]|[-*•])\s+", re.MULTILINE)
_QUESTIONS = _Counter(r"\?")
_SENTENCES = _Counter(r"[.!?](?:\s|$)")

_COUNTERS: tuple[tuple[str, _Counter], ...] = (
    ("code_tokens", _CODE_TOKENS),
    ("code_chars", _CODE_CHARS),
    ("math_symbols", _MATH_SYMBOLS),
    ("numbers", _NUMBERS),
    ("math_words", _MATH_WORDS),
    ("reasoning_cues", _REASONING),
    ("constraint_cues", _CONSTRAINTS),
    ("light_task_cues", _LIGHT_TASK),
    ("chitchat", _CHITCHAT),
    ("enumeration", _ENUMERATION),
    ("questions", _QUESTIONS),
    ("sentences", _SENTENCES),
)

_SHAPE_NAMES = ("user_turns", "assistant_turns", "tool_messages", "system_prompt", "conversation_chars",
                "latest_turn_chars")

FEATURE_NAMES: tuple[str, ...] = (
    "log_chars",
    "log_words",
    "log_lines",
    "short_prompt",
    *(name for name, _ in _COUNTERS),
    *_SHAPE_NAMES,
)


def _shape(shape: ConversationShape) -> list[float]:
    return [math.log1p(shape.user_turns), math.log1p(shape.assistant_turns), math.log1p(shape.tool_messages),
            1.0 if shape.system_prompt else 0.0, math.log1p(shape.total_chars), math.log1p(shape.latest_chars)]


def _one(text: str, shape: ConversationShape | None) -> list[float]:
    words = len(text.split())
    row = [
        math.log1p(len(text)),
        math.log1p(words),
        math.log1p(text.count("\n")),
        1.0 if words <= 8 else 0.0,
    ]
    folded = fold(text)  # once per text, for every IGNORECASE counter
    row.extend(math.log1p(count(text, folded)) for _, count in _COUNTERS)
    row.extend(_shape(shape if shape is not None else prompt_shape(text)))
    return row


def structural_features(texts: Sequence[str],
                        shapes: Sequence[ConversationShape | None] | None = None) -> npt.NDArray[np.float32]:
    """(n, len(FEATURE_NAMES)) float32 array of structural features, row i for texts[i] and shapes[i] (a None
    shape, or no `shapes`: the text is a plain prompt, `prompt_shape`). Pure, fast."""
    if shapes is not None and len(shapes) != len(texts):
        raise ValueError(f"{len(texts)} texts but {len(shapes)} shapes")
    if not texts:
        return np.zeros((0, len(FEATURE_NAMES)), dtype=np.float32)
    given = shapes if shapes is not None else [None] * len(texts)
    return np.asarray([_one(t, s) for t, s in zip(texts, given, strict=True)], dtype=np.float32)
