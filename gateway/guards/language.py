"""The language of a text, by CLD2 (Chromium's compact language detector, `pycld2`): fast (tens of microseconds
for a chat prompt), offline, and honest about doubt: it says whether its answer is reliable.

`detect_language` answers an ISO 639-1 code (CLD2's names: Hebrew is `iw`), or None when the text is too short or
too mixed to tell; a language guard lets those through rather than refuse on a guess.
"""

from __future__ import annotations

import re

import pycld2

__all__ = ["detect_language"]

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")  # CLD2 refuses control characters as invalid UTF-8


def detect_language(text: str, min_chars: int) -> str | None:
    """The language `text` is written in, or None when it is shorter than `min_chars` or CLD2 is not sure."""
    if len(text) < min_chars:
        return None
    data = _CONTROL.sub(" ", text).encode("utf-8", "replace")  # "replace": lone surrogates a JSON body may hold
    reliable, _, details = pycld2.detect(data)
    code = str(details[0][1])
    return code if reliable and code != "un" else None
