"""Unique prompts for timing the scorer: a length-realistic mix, for speed only (no labels, no quality claims).

Two kinds of text, drawn in fixed shares by a seeded generator:

- real prompts from public evaluation sets in `../shared/data/routing` (gzip JSONL with a `"prompt"` field:
  MMLU-Pro, ZeroEval, LLMRouter/DC-Router), which give realistic medium and long prompts (median ~115-490
  characters, a tail of several thousand);
- short chat-like requests assembled from a few word lists here (greetings, lookups, rewrites, small asks),
  because gateway traffic is mostly short and the evaluation sets hold none. They exist to shape the length mix
  and are never used for anything but timing.

When the data folder is absent, long prompts are made by pasting several short ones together as context, so
the bench still runs (with a less realistic mix; `PromptSet.source` says which one was used). Every prompt is
unique and cut to the gateway's 2,000 characters (`conversation_text`'s limit), so cache hits cannot flatter
the scorer.
"""

from __future__ import annotations

import gzip
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DEFAULT_DATA_DIR", "REAL_SOURCES", "PromptSet", "chat_like", "timing_prompts"]

DEFAULT_DATA_DIR = Path(__file__).resolve().parents[3] / "shared" / "data" / "routing"
REAL_SOURCES = (
    "mmlu-pro/mmlu-pro.jsonl.gz",
    "zeroeval/zeroeval.jsonl.gz",
    "llmrouter-dcrouter/llmrouter-dcrouter.jsonl.gz",
)
MAX_CHARS = 2000
CHAT_SHARE = 0.5  # half the arrivals are short chat requests; the rest real (or pasted-context) prompts

_OPENERS = ("", "", "", "hi! ", "hey, ", "quick one: ", "thanks. ", "ok so ", "Hello, ", "please ")
_ASKS = (
    "what's the capital of {w}?",
    "translate '{p}' to {lang}",
    "summarize this in one line: {p}",
    "is {w} a good name for a {thing}?",
    "fix the typo in: {p}",
    "give me a synonym for {w}",
    "write a short birthday message for {name}",
    "how do I reverse a list in {lang_code}?",
    "classify the sentiment: {p}",
    "what time is it in {w} right now",
    "rephrase more politely: {p}",
    "can you recommend a {thing} for {name}?",
    "explain {w} like I'm five",
    "extract the date from: meeting with {name} on {day}",
    "write a haiku about {w}",
    "why does my {thing} keep {verb}?",
)
_WORDS = ("Peru", "Norway", "Kenya", "Vietnam", "entropy", "recursion", "sourdough", "Lisbon", "gravity",
          "inflation", "Kyoto", "photosynthesis", "Atlas", "Quito", "jazz", "compound interest")
_PHRASES = ("the meeting moved to thursday", "I loved the food but the service was slow", "see you tomorow",
            "please send the report by friday", "the package never arrived", "this is the best day ever",
            "can we talk later", "our sales grew by ten percent last quarter")
_FILL = {
    "lang": ("French", "German", "Spanish", "Japanese", "Italian"),
    "lang_code": ("python", "javascript", "rust", "go", "java"),
    "thing": ("startup", "dog", "laptop", "bakery", "podcast", "bike"),
    "name": ("my mom", "Sam", "a coworker", "my brother", "Priya", "the team"),
    "day": ("monday", "the 3rd of May", "next friday", "2024-06-12"),
    "verb": ("crashing", "beeping", "restarting", "overheating", "freezing"),
}


def chat_like(rng: random.Random) -> str:
    """One short chat-style request (typically 5-20 words)."""
    ask = rng.choice(_ASKS)
    fills = {k: rng.choice(v) for k, v in _FILL.items()}
    return rng.choice(_OPENERS) + ask.format(w=rng.choice(_WORDS), p=rng.choice(_PHRASES), **fills)


@dataclass(frozen=True)
class PromptSet:
    """`count` unique prompts in arrival order, and where the long ones came from (`source`)."""

    prompts: list[str]
    source: str


def _real_prompts(data_dir: Path) -> list[str]:
    out: list[str] = []
    for rel in REAL_SOURCES:
        path = data_dir / rel
        if not path.exists():
            continue
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            out.extend(str(json.loads(line)["prompt"]) for line in fh if line.strip())
    return [p for p in dict.fromkeys(out) if p.strip()]


def _pasted(rng: random.Random) -> str:
    context = " ".join(chat_like(rng) for _ in range(rng.randint(3, 40)))
    return f"Context:\n{context}\n\nQuestion: {chat_like(rng)}"


def timing_prompts(count: int, seed: int = 1, data_dir: Path | None = None) -> PromptSet:
    """`count` distinct prompts: `CHAT_SHARE` short chat requests, the rest real evaluation prompts (drawn
    without replacement, then tagged with a request number once exhausted so none repeats). `data_dir`
    defaults to `$CASCADE_ROUTING_DATA` or `../shared/data/routing` beside the repository."""
    rng = random.Random(seed)
    folder = data_dir or Path(os.environ.get("CASCADE_ROUTING_DATA", DEFAULT_DATA_DIR))
    real = _real_prompts(folder)
    rng.shuffle(real)
    source = f"real prompts from {folder} ({len(real)}) + short chat-like requests" if real else (
        f"{folder} absent: short chat-like requests + pasted-context long ones (less realistic)")
    seen: set[str] = set()
    prompts: list[str] = []
    n_real = 0
    while len(prompts) < count:
        if rng.random() < CHAT_SHARE:
            text = chat_like(rng)
        elif real:
            text = real[n_real % len(real)] + (f" (request {n_real})" if n_real >= len(real) else "")
            n_real += 1
        else:
            text = _pasted(rng)
        text = text[:MAX_CHARS]
        if text in seen:  # a repeated chat request gets a distinct tail instead of a cache hit
            text = f"{text} ({len(prompts)})"
        seen.add(text)
        prompts.append(text)
    return PromptSet(prompts, source)
