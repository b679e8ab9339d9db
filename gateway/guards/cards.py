"""Payment card numbers in text: 13-19 digits, grouped as cards are printed or written as one run, with the
issuer prefix of a known card network and a valid Luhn check digit (`stdnum.luhn`). Pure.

The prefix and length must fit the same network: a random 16-digit number passes Luhn one time in ten, and a
known prefix cuts most of the rest. Digits inside a longer number (or after a decimal point) are not a card.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from stdnum import luhn

from gateway.guards.spans import Span

__all__ = ["find_cards"]

_CANDIDATE = re.compile(
    r"(?<!\d)(?<!\d[.,])(?:"
    r"\d{4}([ -])\d{4}\1\d{4}\1\d{4}(?:\1\d{1,3})?"  # 4-4-4-4, and 4-4-4-4-3 for 19 digits
    r"|\d{4}([ -])\d{6}\2\d{4,5}"  # 4-6-5 (Amex), 4-6-4 (Diners)
    r"|\d{13,19}"  # one run
    r")(?!\d)(?![.,]\d)"
)
_DIGITS = re.compile(r"\d[\d -]{11,}\d")  # a cheap first pass: 13 or more characters of digits and separators
# (lowest prefix, highest prefix, lengths), prefixes compared on their own number of digits
_NETWORKS: tuple[tuple[str, str, frozenset[int]], ...] = (
    ("4", "4", frozenset({13, 16, 19})),  # Visa
    ("51", "55", frozenset({16})),  # Mastercard
    ("2221", "2720", frozenset({16})),  # Mastercard 2-series
    ("34", "34", frozenset({15})),  # American Express
    ("37", "37", frozenset({15})),
    ("6011", "6011", frozenset(range(16, 20))),  # Discover
    ("644", "649", frozenset(range(16, 20))),
    ("65", "65", frozenset(range(16, 20))),
    ("3528", "3589", frozenset(range(16, 20))),  # JCB
    ("300", "305", frozenset(range(14, 20))),  # Diners Club
    ("36", "36", frozenset(range(14, 20))),
    ("38", "39", frozenset(range(16, 20))),
    ("62", "62", frozenset(range(16, 20))),  # UnionPay
    ("2200", "2204", frozenset(range(16, 20))),  # Mir
    ("50", "50", frozenset(range(13, 20))),  # Maestro
    ("56", "58", frozenset(range(13, 20))),
    ("67", "67", frozenset(range(13, 20))),
)


def _known_network(digits: str) -> bool:
    return any(low <= digits[:len(low)] <= high and len(digits) in lengths for low, high, lengths in _NETWORKS)


def find_cards(text: str) -> Iterator[Span]:
    """Every card number in `text`."""
    for run in _DIGITS.finditer(text):
        yield from _cards_in(text, run.start(), run.end())


def _cards_in(text: str, start: int, end: int) -> Iterator[Span]:
    # look-behinds see before `start`; the look-aheads need the two characters after `end` (".5" is no card's end)
    for match in _CANDIDATE.finditer(text, start, end + 2):
        digits = re.sub(r"[ -]", "", match.group())
        if _known_network(digits) and luhn.is_valid(digits):
            yield Span(match.start(), match.end(), "card")
