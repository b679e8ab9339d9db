"""One chat-completions request of the load generator, measured: status, TTFT, inter-token gaps, latency.

Streams are read line by line and inspected as bytes (JSON is parsed only for the usage chunk and for
error bodies), so the client costs little CPU beside a gateway and engines on a small machine.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

__all__ = ["RequestSpec", "Sample", "send_one"]

_CONTENT = b'"content":"'
_EMPTY_CONTENT = b'"content":""'
_USAGE = b'"usage":{'
_ERROR = b'"error":'


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """What to send: the URL of `/v1/chat/completions`, the JSON body, headers, and labels for the summary."""

    url: str
    body: bytes
    headers: dict[str, str]
    phase: str
    kind: str
    tenant: str
    stream: bool


@dataclass(slots=True)
class Sample:
    """One request. Times in seconds; `sent_s` from the start of the run. `status` 0: no HTTP answer."""

    phase: str
    kind: str
    tenant: str
    sent_s: float
    status: int = 0
    error: str | None = None
    retry_after: str | None = None
    pool: str | None = None
    degraded: str | None = None
    request_id: str | None = None  # the gateway's x-request-id (to find the request's ledger record)
    ttft_s: float | None = None
    e2e_s: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    gaps_s: list[float] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None

    def to_json(self) -> dict[str, Any]:
        """Compact record for the results file (the gaps are summarised, not listed)."""
        gaps = self.gaps_s
        return {
            "phase": self.phase, "kind": self.kind, "tenant": self.tenant, "sent_s": round(self.sent_s, 4),
            "status": self.status, "error": self.error, "retry_after": self.retry_after, "pool": self.pool,
            "request_id": self.request_id,
            "degraded": self.degraded, "ttft_ms": None if self.ttft_s is None else round(self.ttft_s * 1000, 2),
            "e2e_ms": None if self.e2e_s is None else round(self.e2e_s * 1000, 2),
            "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
            "itl_mean_ms": round(1000 * sum(gaps) / len(gaps), 3) if gaps else None,
        }


def _usage(line: bytes, sample: Sample) -> None:
    usage = orjson.loads(line).get("usage") or {}
    sample.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    sample.completion_tokens = int(usage.get("completion_tokens") or 0)


async def _read_stream(resp: aiohttp.ClientResponse, sample: Sample, started: float) -> None:
    last: float | None = None
    async for raw in resp.content:
        line = raw.rstrip(b"\r\n")
        if not line.startswith(b"data: "):
            continue
        if line.startswith(b"data: [DONE]"):
            return
        if _CONTENT in line and _EMPTY_CONTENT not in line:
            now = time.monotonic()
            if last is None:
                sample.ttft_s = now - started
            else:
                sample.gaps_s.append(now - last)
            last = now
        if _USAGE in line:
            _usage(line[6:], sample)
        elif _ERROR in line[:40]:
            sample.error = f"stream error: {line[6:200].decode(errors='replace')}"
            return
    sample.error = "stream ended without [DONE]"


def _error_text(status: int, body: bytes) -> str:
    try:
        message = orjson.loads(body)["error"]["message"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        message = body[:160].decode(errors="replace")
    return f"HTTP {status}: {str(message)[:160]}"


async def send_one(session: aiohttp.ClientSession, spec: RequestSpec, sent_s: float,
                   answering: Counter[str] | None = None) -> Sample:
    """Send one request and measure it; never raises for HTTP or connection errors (they go in the sample).
    `answering`: streams being answered now per pool (from the 200's headers, which come with the engine's first
    chunk, to the stream's end), for a fault that must land while a client's request is being generated."""
    sample = Sample(spec.phase, spec.kind, spec.tenant, sent_s)
    started = time.monotonic()
    try:
        async with session.post(spec.url, data=spec.body, headers=spec.headers) as resp:
            sample.status = resp.status
            sample.retry_after = resp.headers.get("retry-after")
            sample.pool = resp.headers.get("x-cascade-pool")
            sample.request_id = resp.headers.get("x-request-id")
            sample.degraded = resp.headers.get("x-cascade-degraded")
            if resp.status != 200:
                sample.error = _error_text(resp.status, await resp.read())
            elif spec.stream:
                with _counted(answering, sample.pool or "-"):
                    await _read_stream(resp, sample, started)
            else:
                body = await resp.read()
                sample.ttft_s = None
                _usage(body, sample)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        sample.error = f"{type(exc).__name__}: {exc}"[:200]
    sample.e2e_s = time.monotonic() - started
    return sample


@contextmanager
def _counted(counts: Counter[str] | None, key: str) -> Iterator[None]:
    if counts is None:
        yield
        return
    counts[key] += 1
    try:
        yield
    finally:
        counts[key] -= 1
