"""A found piece of personal data or a secret: where it is in one text, and of which kind."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Span", "without_overlaps"]


@dataclass(frozen=True, slots=True, order=True)
class Span:
    """`text[start:end]` is a match of `kind` (`policies.guards.PiiKind`). Holds no text: safe to log and count."""

    start: int
    end: int
    kind: str


def without_overlaps(spans: list[Span]) -> list[Span]:
    """The spans in text order with overlaps removed: of two that overlap, the one that starts first is kept, and
    of two that start together, the longer (a card number is not also two phone numbers)."""
    kept: list[Span] = []
    for span in sorted(spans, key=lambda s: (s.start, -s.end)):
        if not kept or span.start >= kept[-1].end:
            kept.append(span)
    return kept
