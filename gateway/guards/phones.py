"""Phone numbers in text, found by Google's libphonenumber (the `phonenumbers` port), valid numbers only.

A number written with its country code (+44 ...) is found whatever the regions; a national one (415-555-2671,
020 7946 0958) in the formats of the regions given. Digits grouped otherwise than the region's numbers are
(libphonenumber's strict grouping: "131072 64", "31000.00") are not a phone number, nor is a bare run of digits
without a + (an order id, a reference: 2125551234) or a decimal number (1544.3162072): numbers people write for
others to call carry a + or the usual separators.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from phonenumbers import Leniency, PhoneNumberMatcher

from gateway.guards.spans import Span

__all__ = ["find_phones"]

# Where a number may be: a digit, then digits and the separators people write in numbers, then a digit. The
# matcher (pure Python, ~100 us for a page of text) reads only these windows, with a little context each side.
_WINDOW = re.compile(r"\+?\(?\d[\d ().\-/\t]{5,24}\d")
_CONTEXT = 2
_MIN_DIGITS = 7  # the shortest numbers libphonenumber validates
_NOT_A_PHONE = re.compile(r"\d+(?:\.\d+)?")  # a bare run of digits, or a decimal number


def find_phones(text: str, regions: tuple[str, ...]) -> Iterator[Span]:
    """Every phone number in `text`, for the national formats of `regions` (ISO 3166 alpha-2)."""
    for window in _WINDOW.finditer(text):
        if sum(c.isdigit() for c in window.group()) < _MIN_DIGITS:
            continue
        at = max(0, window.start() - _CONTEXT)
        part = text[at:window.end() + _CONTEXT]
        for region in regions or ("ZZ",):  # ZZ: unknown region, international numbers only
            for match in PhoneNumberMatcher(part, region, leniency=Leniency.STRICT_GROUPING):
                if not _NOT_A_PHONE.fullmatch(match.raw_string):
                    yield Span(at + match.start, at + match.end, "phone")
