"""International bank account numbers in text, written as one run or in groups of four, checked with
`stdnum.iban` (the country's length and account format, and the mod-97 check digits). Pure.

A candidate runs greedily over following groups ("... 3000 AND"), so the longest prefix that validates is taken.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from stdnum import iban

from gateway.guards.spans import Span

__all__ = ["find_ibans"]

_CANDIDATE = re.compile(r"(?<![A-Za-z0-9])[A-Za-z]{2}\d{2}(?: ?[A-Za-z0-9]){11,30}(?![A-Za-z0-9])")
_SHORTEST = 15  # Norway's


def find_ibans(text: str) -> Iterator[Span]:
    """Every IBAN in `text`."""
    for match in _CANDIDATE.finditer(text):
        raw = match.group()
        ends = [i + 1 for i, ch in enumerate(raw) if ch != " "]  # ends[k]: where the first k+1 characters end
        compact = raw.replace(" ", "").upper()
        for length in range(len(compact), _SHORTEST - 1, -1):
            if iban.is_valid(compact[:length]):
                yield Span(match.start(), match.start() + ends[length - 1], "iban")
                break
