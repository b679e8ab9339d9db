"""Personal data and secrets in message text: found (`find_pii`) and replaced by typed placeholders (`redact`).

Each kind has its own finder (`emails` here; `phones`, `cards`, `ibans`, `credentials`); a tenant's `PiiGuard`
says which kinds to look for. Placeholders are `[REDACTED:<kind>]`, so the engine still sees that something was
there and of what kind. Pure: no text leaves this module except the redacted text.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from gateway.guards.cards import find_cards
from gateway.guards.credentials import find_credentials
from gateway.guards.ibans import find_ibans
from gateway.guards.phones import find_phones
from gateway.guards.spans import Span, without_overlaps
from policies.guards import PiiGuard

__all__ = ["find_emails", "find_pii", "placeholder", "redact"]

_EMAIL = re.compile(r"(?<![A-Za-z0-9._%+\-])[A-Za-z0-9._%+\-]+@[A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)*\.[A-Za-z]{2,24}"
                    r"(?![A-Za-z0-9\-])")


def find_emails(text: str) -> Iterator[Span]:
    """Every e-mail address in `text` (a local part, @, a domain with a top-level label of letters)."""
    if "@" in text:
        for match in _EMAIL.finditer(text):
            yield Span(match.start(), match.end(), "email")


def find_pii(text: str, guard: PiiGuard) -> list[Span]:
    """The matches of `guard.kinds` in `text`, in order and without overlaps. Secrets and bank details are looked
    for first: a key or an IBAN holds digit runs that must not be half-taken for a phone number."""
    kinds = set(guard.kinds)
    spans: list[Span] = []
    if "secret" in kinds:
        spans.extend(find_credentials(text))
    if "iban" in kinds:
        spans.extend(find_ibans(text))
    if "card" in kinds:
        spans.extend(find_cards(text))
    if "email" in kinds:
        spans.extend(find_emails(text))
    if "phone" in kinds:
        spans.extend(find_phones(text, guard.phone_regions))
    return without_overlaps(spans)


def placeholder(kind: str) -> str:
    return f"[REDACTED:{kind}]"


def redact(text: str, spans: list[Span]) -> str:
    """`text` with each of `spans` (in order, not overlapping: `find_pii`'s) replaced by its placeholder."""
    out, at = [], 0
    for span in spans:
        out.append(text[at:span.start])
        out.append(placeholder(span.kind))
        at = span.end
    out.append(text[at:])
    return "".join(out)
