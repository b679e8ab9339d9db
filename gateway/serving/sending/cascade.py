"""The true cascade: answer on the micro pool, judge its confidence, escalate to the flagship if unsure.

Confidence is the geometric mean of the answer's token probabilities, exp(mean logprob), taken from the
engine's own logprobs. Non-streaming answers are judged whole; streams are judged on their first N
tokens, held back from the client until then, so an escalation never shows the client a byte of the
discarded answer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.serving.sending.proxy import OpenStream
from gateway.serving.sending.streaming import sse_json

__all__ = ["StreamProbe", "confidence", "logprobs_of_choice", "probe_stream"]


def logprobs_of_choice(choice: dict[str, Any]) -> list[float]:
    """Token logprobs of one OpenAI choice (message or delta form); empty when the engine gave none."""
    content = (choice.get("logprobs") or {}).get("content") or ()
    return [float(t["logprob"]) for t in content if isinstance(t, dict) and isinstance(t.get("logprob"), int | float)]


def confidence(logprobs: Iterable[float]) -> float | None:
    """exp(mean logprob) in [0, 1]; None for an empty answer (nothing to judge)."""
    values = [max(lp, -100.0) for lp in logprobs]
    return math.exp(sum(values) / len(values)) if values else None


def answer_logprobs(body: bytes) -> list[float]:
    """Logprobs of the first choice of a non-streaming answer."""
    try:
        choices = orjson.loads(body).get("choices") or []
    except orjson.JSONDecodeError:
        return []
    return logprobs_of_choice(choices[0]) if choices else []


@dataclass(slots=True)
class StreamProbe:
    """What the first tokens of a stream showed. `held` is every byte read so far, to be replayed."""

    held: bytes
    logprobs: list[float]
    ended: bool
    text: str


def _scan(event: bytes, probe: StreamProbe) -> None:
    for chunk in sse_json(event):
        for choice in chunk.get("choices") or ():
            probe.logprobs.extend(logprobs_of_choice(choice))
            probe.text += (choice.get("delta") or {}).get("content") or ""
    if b"data: [DONE]" in event:
        probe.ended = True


async def probe_stream(opened: OpenStream, first_tokens: int) -> StreamProbe:
    """Read the stream until `first_tokens` tokens have logprobs or it ends. Nothing is sent anywhere."""
    probe = StreamProbe(held=opened.first_chunk, logprobs=[], ended=False, text="")
    pending = opened.first_chunk
    while True:
        *events, pending = pending.split(b"\n\n")
        for event in events:
            _scan(event, probe)
        if probe.ended or len(probe.logprobs) >= first_tokens:
            return probe
        chunk = await anext(opened.chunks, None)
        if chunk is None:
            probe.ended = True
            return probe
        probe.held += chunk
        pending += chunk


def cascade_headers(escalated: bool, conf: float | None) -> dict[str, str]:
    shown = "none" if conf is None else f"{conf:.4f}"
    return {"x-cascade-escalated": "true" if escalated else "false", "x-cascade-confidence": shown}


def without_logprobs(body: bytes) -> bytes:
    """Drop the logprobs the cascade asked for from an answer whose client did not ask for them."""
    try:
        answer = orjson.loads(body)
        for choice in answer.get("choices") or ():
            choice["logprobs"] = None
        return orjson.dumps(answer)
    except (orjson.JSONDecodeError, AttributeError, TypeError):
        return body
