"""Closed-loop streaming chat-completions client: tokens/s and time to first token.

`concurrency` workers share one aiohttp session; each sends one streaming request after the other
until `duration_s` has passed, then finishes the request it has in flight. Throughput is the sum of
the completion tokens reported by the usage chunks, divided by the wall time from the start until the
last request ended. Chunks are inspected as bytes (no JSON parsing except for the one usage chunk), so
the client itself costs little CPU on a small machine.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
import orjson

from loadtest.load.connections import connector

__all__ = ["StreamResult", "StreamSample", "percentile", "run_closed_loop", "scan_sse_line", "stream_body"]

_CONTENT = b'"content":"'
_EMPTY_CONTENT = b'"content":""'
_USAGE = b'"usage":{'


@dataclass(slots=True)
class StreamSample:
    """One streamed request: completion tokens (from the usage chunk), TTFT in seconds, error if any."""

    tokens: int = 0
    ttft_s: float | None = None
    error: str | None = None


@dataclass(slots=True)
class StreamResult:
    """What a closed-loop run measured."""

    url: str
    concurrency: int
    wall_s: float
    requests: int
    errors: int
    tokens: int
    tokens_per_s: float
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    error_examples: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def stream_body(model: str, max_tokens: int, prompt: str = "Tell me a short story about a robot.") -> bytes:
    """The request body: `ignore_eos` makes every answer exactly `max_tokens` long (vLLM extension)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
        "temperature": 0.0,
    }
    return orjson.dumps(body)


def scan_sse_line(line: bytes, sample: StreamSample, started: float) -> bool:
    """Update `sample` from one SSE line; True when the stream has ended (`data: [DONE]`)."""
    if not line.startswith(b"data: "):
        return False
    if line.startswith(b"data: [DONE]"):
        return True
    if sample.ttft_s is None and _CONTENT in line and _EMPTY_CONTENT not in line:
        sample.ttft_s = time.monotonic() - started
    if _USAGE in line:
        usage = orjson.loads(line[6:]).get("usage") or {}
        sample.tokens = int(usage.get("completion_tokens") or 0)
    return False


async def _one(session: aiohttp.ClientSession, url: str, body: bytes) -> StreamSample:
    sample = StreamSample()
    started = time.monotonic()
    try:
        async with session.post(url, data=body, headers={"content-type": "application/json"}) as resp:
            if resp.status != 200:
                sample.error = f"HTTP {resp.status}: {(await resp.read())[:200]!r}"
                return sample
            async for raw in resp.content:
                if scan_sse_line(raw.rstrip(b"\r\n"), sample, started):
                    break
    except (aiohttp.ClientError, TimeoutError) as exc:
        sample.error = f"{type(exc).__name__}: {exc}"
    if sample.error is None and sample.tokens == 0:
        sample.error = "stream ended without a usage chunk"
    return sample


async def _worker(session: aiohttp.ClientSession, url: str, body: bytes, deadline: float,
                  out: list[StreamSample]) -> None:
    while time.monotonic() < deadline:
        out.append(await _one(session, url, body))


def _summarise(url: str, concurrency: int, wall_s: float, samples: list[StreamSample]) -> StreamResult:
    good = [s for s in samples if s.error is None]
    tokens = sum(s.tokens for s in good)
    ttfts = [s.ttft_s * 1000.0 for s in good if s.ttft_s is not None]
    errors = [s.error for s in samples if s.error is not None]
    return StreamResult(
        url=url, concurrency=concurrency, wall_s=wall_s, requests=len(samples), errors=len(errors),
        tokens=tokens, tokens_per_s=tokens / wall_s if wall_s > 0 else 0.0,
        ttft_p50_ms=percentile(ttfts, 50), ttft_p99_ms=percentile(ttfts, 99), error_examples=errors[:3],
    )


async def run_closed_loop(base_url: str, model: str, concurrency: int, duration_s: float,
                          max_tokens: int = 64, timeout_s: float = 120.0) -> StreamResult:
    """Run `concurrency` closed-loop streaming clients against `base_url` for `duration_s` seconds."""
    url = base_url.rstrip("/") + "/v1/chat/completions"
    body = stream_body(model, max_tokens)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    samples: list[StreamSample] = []
    async with aiohttp.ClientSession(connector=connector(concurrency * 2), timeout=timeout) as session:
        started = time.monotonic()
        deadline = started + duration_s
        await asyncio.gather(*(_worker(session, url, body, deadline, samples) for _ in range(concurrency)))
        wall = time.monotonic() - started
    return _summarise(url, concurrency, wall, samples)
