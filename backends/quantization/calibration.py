"""Calibration samples for quantization: read from JSONL (the gateway's request log or plain lines).

Accepted lines (one JSON object each; blank lines skipped):

- a request-log line (``gateway.serving.records.request_log``):
  ``{"request": {"messages": [...]}, "pool": "flagship", ...}``;
- a chat: ``{"messages": [{"role": "user", "content": "..."}]}``;
- plain text: ``{"text": "..."}`` or ``{"prompt": "..."}``.

With ``pool`` set, request-log lines recorded for other pools are skipped (lines without a pool are kept).
The demo has no recorded traffic on a fresh machine, so :func:`demo_samples` builds chats from the
corpus the demo tokenizer was trained on (shipped in ``backends/models/data``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backends.models.demo import corpus_path

__all__ = ["DEFAULT_REQUEST_LOG", "CalibrationError", "CalibrationSet", "demo_samples", "load_samples"]

Sample = dict[str, Any]
DEFAULT_REQUEST_LOG = "requests.jsonl"  # under the cascade home: where `cascade serve --request-log` may write


class CalibrationError(ValueError):
    """The calibration file is unreadable, malformed, or holds too few samples."""


@dataclass(frozen=True)
class CalibrationSet:
    """Samples plus where they came from; ``sha256`` fingerprints their content for the metadata."""

    samples: tuple[Sample, ...]
    source: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(json.dumps(self.samples, sort_keys=True).encode()).hexdigest()


def _sample(obj: Any, pool: str | None) -> Sample | None:
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    if "request" in obj:
        if pool is not None and obj.get("pool") not in (None, pool):
            return None
        obj = obj["request"]
        if not isinstance(obj, dict):
            raise ValueError("`request` is not an object")
    messages = obj.get("messages")
    if isinstance(messages, list) and messages:
        clean = [{"role": str(m.get("role", "user")), "content": m["content"]} for m in messages
                 if isinstance(m, dict) and isinstance(m.get("content"), str)]
        return {"messages": clean} if clean else None
    for key in ("text", "prompt"):
        if isinstance(obj.get(key), str) and obj[key].strip():
            return {"text": obj[key]}
    raise ValueError("no `messages`, `text` or `prompt`")


def parse_samples(lines: Iterable[str], source: str, pool: str | None = None) -> list[Sample]:
    samples = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            sample = _sample(json.loads(line), pool)
        except ValueError as exc:
            raise CalibrationError(f"{source}:{number}: {exc}") from exc
        if sample is not None:
            samples.append(sample)
    return samples


def load_samples(path: Path, *, pool: str | None = None, limit: int = 256, minimum: int = 8) -> CalibrationSet:
    """Up to ``limit`` samples from ``path`` (the first ones). Raises CalibrationError below ``minimum``."""
    try:
        with path.open(encoding="utf-8") as handle:
            samples = parse_samples(handle, str(path), pool)
    except OSError as exc:
        raise CalibrationError(f"cannot read calibration file {path}: {exc.strerror}") from exc
    if len(samples) < minimum:
        which = f" for pool {pool!r}" if pool else ""
        raise CalibrationError(f"{path} holds {len(samples)} usable samples{which}; at least {minimum} are needed "
                               "(record more traffic with `cascade serve --request-log`, or pass --calibration)")
    return CalibrationSet(tuple(samples[:limit]), str(path))


def demo_samples(limit: int = 64) -> CalibrationSet:
    """Chats built from the demo corpus: each paragraph's sentences become user turns."""
    corpus = corpus_path()
    text = " ".join(corpus.read_text(encoding="utf-8").split())
    sentences = [s.strip() + "." for s in text.split(". ") if len(s.strip()) > 20]
    samples: list[Sample] = [{"messages": [{"role": "user", "content": s}]} for s in sentences]
    return CalibrationSet(tuple(samples[:limit]), f"demo corpus ({corpus.name})")
