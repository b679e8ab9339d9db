"""Closed-loop client traffic for the chaos tests, the client's own account of every request, and the
reconciliation of that account with the Redis ledger.

Each request ends as exactly one `Kind`: COMPLETED (a whole answer with usage), FAILED (an OpenAI error
body: an HTTP error status, or an error event inside a stream), REFUSED (no connection, or the server
closed it before any response byte: nothing was processed), or BROKEN (anything else: a response cut
off without an error, a malformed error, a timeout). Chaos may cause FAILED and REFUSED; never BROKEN.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

import httpx
import orjson

from loadtest.scenarios.chaos_figures import ledger_records
from tests.conftest import verify_recent

__all__ = ["Kind", "Outcome", "Traffic", "ledger_records", "reconcile"]

Body = Callable[[int], dict[str, Any]]


class Kind(Enum):
    COMPLETED = "completed"
    FAILED = "failed"
    REFUSED = "refused"
    BROKEN = "broken"


@dataclass(frozen=True, slots=True)
class Outcome:
    kind: Kind
    started: float  # monotonic
    ended: float
    stream: bool
    request_id: str | None = None
    pool: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    detail: str = ""


def _is_error_body(payload: Any) -> bool:
    error = payload.get("error") if isinstance(payload, dict) else None
    return isinstance(error, dict) and isinstance(error.get("message"), str) and isinstance(error.get("type"), str)


def _json_outcome(resp: httpx.Response, content: bytes, base: dict[str, Any]) -> Outcome:
    try:
        payload = orjson.loads(content)
    except orjson.JSONDecodeError:
        return Outcome(Kind.BROKEN, **base, detail=f"HTTP {resp.status_code}, not JSON: {content[:200]!r}")
    if resp.status_code == 200 and isinstance(payload, dict) and isinstance(payload.get("usage"), dict):
        usage = payload["usage"]
        return Outcome(Kind.COMPLETED, **base, prompt_tokens=usage["prompt_tokens"],
                       completion_tokens=usage["completion_tokens"])
    if resp.status_code >= 400 and _is_error_body(payload):
        return Outcome(Kind.FAILED, **base, detail=f"HTTP {resp.status_code}: {payload['error']['message']}")
    return Outcome(Kind.BROKEN, **base, detail=f"HTTP {resp.status_code}: {content[:200]!r}")


def _stream_outcome(events: list[bytes], base: dict[str, Any]) -> Outcome:
    usage: dict[str, int] | None = None
    for data in events:
        if data == b"[DONE]":
            if usage is None:
                return Outcome(Kind.BROKEN, **base, detail="stream ended without a usage chunk")
            return Outcome(Kind.COMPLETED, **base, prompt_tokens=usage["prompt_tokens"],
                           completion_tokens=usage["completion_tokens"])
        chunk = orjson.loads(data)
        if _is_error_body(chunk):
            return Outcome(Kind.FAILED, **base, detail=f"stream error event: {chunk['error']['message']}")
        if isinstance(chunk.get("usage"), dict):
            usage = chunk["usage"]
    return Outcome(Kind.BROKEN, **base, detail=f"stream cut off after {len(events)} events without an error")


class Traffic:
    """`concurrency` clients, each sending `body(i)` requests back to back until `stop()`. Connections are
    not kept alive between requests, so that a refused request is told apart from one that was cut."""

    def __init__(self, base_url: str, body: Body, concurrency: int = 4, timeout_s: float = 60.0,
                 pause_s: float = 0.0, headers: dict[str, str] | None = None) -> None:
        self.base_url = base_url
        self._headers = headers or {}
        self.outcomes: list[Outcome] = []
        self._body = body
        self._concurrency = concurrency
        self._timeout = timeout_s
        self._pause = pause_s
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._sent = 0

    def start(self) -> None:
        limits = httpx.Limits(max_keepalive_connections=0)
        # No shorter connect timeout: on loopback the kernel completes the handshake whether or not the server's
        # loop is free (a stopped server refuses at once), so a slow connect only measures this client's own
        # process being held up (a loaded machine), which must not count as a broken request.
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(self._timeout), limits=limits,
                                         headers=self._headers)
        self._tasks = [asyncio.create_task(self._worker()) for _ in range(self._concurrency)]

    async def stop(self) -> list[Outcome]:
        """Stop sending; wait for the requests in flight (each bounded by the timeout)."""
        self._stopping.set()
        await asyncio.gather(*self._tasks)
        await self._client.aclose()
        return self.outcomes

    def count(self, since: float = 0.0) -> Counter[Kind]:
        return Counter(o.kind for o in self.outcomes if o.started >= since)

    async def wait_for(self, predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s} s waiting for {what}: {self.count()}")
            await asyncio.sleep(0.1)

    async def _worker(self) -> None:
        while not self._stopping.is_set():
            i, self._sent = self._sent, self._sent + 1
            self.outcomes.append(await self.one(self._body(i)))
            if self._pause:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), self._pause)

    async def one(self, body: dict[str, Any]) -> Outcome:
        started = time.monotonic()
        stream = bool(body.get("stream"))
        base: dict[str, Any] = {"started": started, "stream": stream}
        try:
            async with self._client.stream("POST", self.base_url + "/v1/chat/completions", json=body) as resp:
                base.update(request_id=resp.headers.get("x-request-id"), pool=resp.headers.get("x-cascade-pool"))
                if stream and resp.status_code == 200:
                    events = [line[6:].encode() async for line in resp.aiter_lines() if line.startswith("data: ")]
                    return _stream_outcome(events, {**base, "ended": time.monotonic()})
                content = await resp.aread()
                return _json_outcome(resp, content, {**base, "ended": time.monotonic()})
        except (httpx.ConnectError, httpx.RemoteProtocolError) as exc:
            kind = Kind.REFUSED if "request_id" not in base else Kind.BROKEN
            return Outcome(kind, **base, ended=time.monotonic(), detail=f"{type(exc).__name__}: {exc}")
        except httpx.HTTPError as exc:
            return Outcome(Kind.BROKEN, **base, ended=time.monotonic(), detail=f"{type(exc).__name__}: {exc}")


async def _verify(redis_url: str, prefix: str) -> tuple[bool, str]:
    result = await verify_recent(prefix, redis_url)
    return result.ok, repr(result)


async def reconcile(outcomes: list[Outcome], redis_url: str, prefix: str, settle_s: float = 10.0) -> dict[str, int]:
    """Assert that the ledger agrees with the client: one `ok` record per completed request, with the
    tokens the client was told, no record twice, rollups equal to the records (`cascade costs verify`).
    Waits up to `settle_s` for records still on their way (an outbox drain). Returns a summary."""
    done = [o for o in outcomes if o.kind is Kind.COMPLETED]
    assert all(o.request_id for o in done), "a completed response without x-request-id"
    completed = {str(o.request_id): o for o in done}
    deadline = time.monotonic() + settle_s
    while True:
        records = await asyncio.to_thread(ledger_records, redis_url, prefix)
        ok = {r["request_id"]: r for r in records if r["status"] == "ok"}
        if ok.keys() >= completed.keys() or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    ids = Counter(r["request_id"] for r in records)
    assert not [i for i, n in ids.items() if n > 1], f"request ids recorded twice: {ids.most_common(3)}"
    assert ok.keys() == completed.keys(), (
        f"completed but not recorded: {sorted(completed.keys() - ok.keys())[:5]}; "
        f"recorded ok but not completed: {sorted(ok.keys() - completed.keys())[:5]}")
    for rid, outcome in completed.items():
        rec = ok[rid]
        assert (int(rec["prompt_tokens"]), int(rec["completion_tokens"])) == (
            outcome.prompt_tokens, outcome.completion_tokens), (rid, rec, outcome)
        assert rec["pool"] == outcome.pool, (rid, rec, outcome)
    verified, detail = await _verify(redis_url, prefix)
    assert verified, detail
    return {"completed": len(completed), "records": len(records), "ok_records": len(ok)}
