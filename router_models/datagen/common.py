"""Shared helpers of the prompt generators: seeded template filling and JSONL writing."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

__all__ = ["Example", "Maker", "expand", "write_jsonl"]

Example = dict[str, Any]
Maker = Callable[[random.Random], str]


def expand(
    rng: random.Random, makers: Iterable[Maker], n: int, label: int, kind: str, **extra: Any
) -> list[Example]:
    """`n` distinct prompts drawn round-robin from `makers`, each tagged with `label` and `kind`."""
    makers = list(makers)
    seen: set[str] = set()
    out: list[Example] = []
    attempts = 0
    while len(out) < n and attempts < n * 30:
        text = makers[attempts % len(makers)](rng).strip()
        attempts += 1
        if text not in seen:
            seen.add(text)
            out.append({"prompt": text, "label": label, "kind": kind, **extra})
    return out


def write_jsonl(rows: Iterable[Example], path: Path) -> int:
    """Write rows as JSON lines (UTF-8, sorted keys); returns the row count."""
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")
            n += 1
    return n
