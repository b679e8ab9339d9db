"""The prompt mix of the load generator: short/long x easy/hard chat prompts, drawn with fixed weights.

Prompts come from `loadtest/data/synthetic_prompts.jsonl` (label 0: the micro pool's answer is good enough,
"easy"; label 1: it needs the flagship, "hard"). A "long" prompt is one of them preceded by a block of
other prompts as pasted context, so it is several hundred tokens while staying under the demo engines'
1,024-token context with the answer.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import orjson

__all__ = ["DEFAULT_MIX", "MIXED_EVAL", "MixItem", "PromptMix", "parse_mix"]

MIXED_EVAL = Path(__file__).resolve().parents[1] / "data" / "synthetic_prompts.jsonl"
DEFAULT_MIX = "short-easy:4,short-hard:2,long-easy:1,long-hard:1"
_KINDS = ("short-easy", "short-hard", "long-easy", "long-hard")
_LONG_CONTEXT_WORDS = 260


@dataclass(frozen=True, slots=True)
class MixItem:
    """One prompt to send: its class (e.g. `long-hard`) and its chat messages."""

    kind: str
    messages: tuple[dict[str, str], ...]


def parse_mix(text: str) -> dict[str, float]:
    """`"short-easy:4,long-hard:1"` → weights. Raises ValueError naming the bad part."""
    weights: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        kind, _, weight = part.partition(":")
        if kind not in _KINDS:
            raise ValueError(f"unknown prompt class {kind!r} in --mix; use {', '.join(_KINDS)}")
        try:
            weights[kind] = float(weight or "1")
        except ValueError as exc:
            raise ValueError(f"bad weight {weight!r} for {kind} in --mix") from exc
        if weights[kind] < 0:
            raise ValueError(f"negative weight for {kind} in --mix")
    if not weights or sum(weights.values()) <= 0:
        raise ValueError("--mix needs at least one class with a positive weight")
    return weights


class PromptMix:
    """Draws `MixItem`s with the given class weights from a seeded generator (reproducible runs)."""

    def __init__(self, weights: dict[str, float], path: Path = MIXED_EVAL, seed: int = 0) -> None:
        rows = [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
        self._easy = [str(r["prompt"]) for r in rows if int(r.get("label", 0)) == 0]
        self._hard = [str(r["prompt"]) for r in rows if int(r.get("label", 0)) == 1]
        if not self._easy or not self._hard:
            raise ValueError(f"{path}: needs prompts with label 0 (easy) and 1 (hard)")
        self._all = self._easy + self._hard
        self._kinds = list(weights)
        self._weights = [weights[k] for k in self._kinds]
        self._rng = random.Random(seed)

    def _context(self) -> str:
        words: list[str] = []
        while len(words) < _LONG_CONTEXT_WORDS:
            words.extend(self._rng.choice(self._all).split())
        return " ".join(words[:_LONG_CONTEXT_WORDS])

    def draw(self) -> MixItem:
        kind = self._rng.choices(self._kinds, self._weights)[0]
        prompt = self._rng.choice(self._hard if kind.endswith("hard") else self._easy)
        if kind.startswith("long"):
            prompt = f"Here are some notes for context:\n{self._context()}\n\nNow the question: {prompt}"
        return MixItem(kind, ({"role": "user", "content": prompt},))
