"""Send a request to a pool, failing over between replicas while no byte has reached the client.

A replica that cannot be reached (or resets the connection before its first byte) is marked down and
the next-least-loaded replica is tried. A replica that answers with a 5xx is tried no more for this request
(it stays in the pool: its breaker decides) and the next one is tried; when none is left, the client gets
the last engine error as a 502. An engine's 4xx (a bad parameter, say) is not retried, since another replica
would answer the same. Nothing is retried once a byte may have reached the client: `open_stream` returns at
the first chunk and whatever breaks after it ends the stream. Every outcome goes to the replica's circuit
breaker: unreachable, broken streams and 5xx answers count as failures, any other answer as a success.

Retries run inside the caller's deadline (`asyncio.timeout` around the request in `gateway.api.chat`): a
retry that would outlast it is cancelled there and the client gets the deadline's 504, never a late answer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass

import orjson

from backends.clients.pool import Pool, Replica
from backends.clients.shared import EngineClient, EngineHTTPError, EngineStreamBroken, EngineTimeout, EngineUnavailable
from gateway.errors import NoReplicaAvailable, UpstreamError
from gateway.serving.records.tracing import Tracing

__all__ = ["InFlightHook", "OpenStream", "Proxy"]

log = logging.getLogger("cascade.proxy")
_CHAT = "/v1/chat/completions"
InFlightHook = Callable[[str, Replica], None]
"""Called as `(pool name, replica)` right after the proxy changed `replica.in_flight` (must not raise)."""


@dataclass(slots=True)
class OpenStream:
    """An upstream stream that has produced its first chunk. The caller owns `upstream` (closes it)."""

    replica: Replica
    first_chunk: bytes
    chunks: AsyncIterator[bytes]
    upstream: AsyncExitStack


def _upstream_error(exc: EngineHTTPError, pool: str) -> UpstreamError:
    message = f"engine of pool {pool!r} rejected the request (HTTP {exc.status})"
    param = None
    try:
        err = orjson.loads(exc.body)
        detail = err.get("error", err) if isinstance(err, dict) else {}
        if isinstance(detail, dict):
            message = f"{message}: {detail.get('message', '')}".rstrip(": ")
            param = detail.get("param") if isinstance(detail.get("param"), str) else None
    except orjson.JSONDecodeError:
        pass
    status = exc.status if 400 <= exc.status < 500 else 502
    return UpstreamError(message, status, param=param, code="upstream_rejected")


class _Attempts:
    """The replicas one request tries: the least-loaded untried one per attempt, backing off (25, 50 ms...)
    between attempts, at most `max_attempts`. When none is left, `next` raises the last engine 5xx (as a
    502 `UpstreamError`) if there was one, else `NoReplicaAvailable`."""

    def __init__(self, pool: Pool, max_attempts: int, backoff_s: float) -> None:
        self._pool, self._max, self._backoff = pool, max_attempts, backoff_s
        self._tried: set[str] = set()
        self._last_error: UpstreamError | None = None

    async def next(self) -> Replica:
        tried = self._tried
        if tried:
            await asyncio.sleep(self._backoff * 2 ** (len(tried) - 1))
        replica = self._pool.choose(frozenset(tried)) if len(tried) < self._max else None
        if replica is None:
            if self._last_error is not None:
                raise self._last_error
            raise NoReplicaAvailable(
                f"no replica of pool {self._pool.name!r} is available ({len(tried)} tried); retry shortly"
            )
        tried.add(replica.url)
        return replica

    def retry_after(self, exc: EngineHTTPError, replica: Replica) -> None:
        """After an engine error status: raise it at once when it is the request's fault (4xx); keep it
        as the answer of last resort and let the loop try another replica when it is the engine's (5xx)."""
        error = _upstream_error(exc, self._pool.name)
        if exc.status < 500:
            raise error from exc
        error.__cause__ = exc
        self._last_error = error
        log.warning("engine error, retrying on another replica",
                    extra={"pool": self._pool.name, "replica": replica.url, "status": exc.status})


class Proxy:
    """Forwards requests (chat, Responses, completions) to pool replicas. Owns nothing; counts in-flight per
    replica and tells `on_in_flight` (the metrics) each change."""

    def __init__(self, client: EngineClient, max_attempts: int = 3, backoff_s: float = 0.025,
                 on_in_flight: InFlightHook | None = None) -> None:
        self._client = client
        self._max_attempts = max_attempts
        self._backoff = backoff_s
        self._on_in_flight = on_in_flight
        self.tracing = Tracing()  # off; the runtime sets the gateway's (`gateway.serving.records.tracing`)

    def _count(self, pool: Pool, replica: Replica, delta: int) -> None:
        replica.in_flight += delta
        if self._on_in_flight is not None:
            self._on_in_flight(pool.name, replica)

    def _replicas(self, pool: Pool) -> _Attempts:
        return _Attempts(pool, self._max_attempts, self._backoff)

    async def complete(self, pool: Pool, body: bytes, path: str = _CHAT) -> tuple[Replica, bytes]:
        """Non-streaming call to the engines' `path` (an OpenAI endpoint: chat unless said). Returns the replica
        that answered and the engine's JSON body."""
        attempts = self._replicas(pool)
        while True:
            replica = await attempts.next()
            self._count(pool, replica, 1)
            span, headers = self.tracing.attempt(pool.name, replica.url, pool.headers)
            try:
                answer = await self._client.post_json(replica.url, path, body, headers)
            except EngineUnavailable as exc:
                Tracing.attempt_ended(span, None, "engine_unavailable")
                _failed(pool, replica, exc)
            except EngineHTTPError as exc:
                Tracing.attempt_ended(span, exc.status)
                _answered(replica, exc.status)
                attempts.retry_after(exc, replica)
            except BaseException:
                Tracing.attempt_ended(span, None, "cancelled")
                replica.breaker.release()
                raise
            else:
                Tracing.attempt_ended(span, 200)
                replica.breaker.record_success()
                return replica, answer
            finally:
                self._count(pool, replica, -1)

    async def open_stream(self, pool: Pool, body: bytes, path: str = _CHAT) -> OpenStream:
        """Streaming call to the engines' `path`, opened up to its first chunk (so failover is still possible
        until then).

        The replica's in-flight count stays raised until the caller closes `upstream`.
        """
        attempts = self._replicas(pool)
        while True:
            replica = await attempts.next()
            stack = AsyncExitStack()
            self._count(pool, replica, 1)
            stack.callback(self._count, pool, replica, -1)
            span, headers = self.tracing.attempt(pool.name, replica.url, pool.headers)  # ends at the first chunk
            try:
                chunks = await stack.enter_async_context(self._client.stream(replica.url, path, body, headers))
                first = await anext(aiter(chunks), b"")
            except (EngineUnavailable, EngineStreamBroken) as exc:
                Tracing.attempt_ended(span, None, "engine_unavailable")
                await stack.aclose()
                _failed(pool, replica, exc)
            except EngineHTTPError as exc:
                Tracing.attempt_ended(span, exc.status)
                await stack.aclose()
                _answered(replica, exc.status)
                attempts.retry_after(exc, replica)
            except BaseException:
                Tracing.attempt_ended(span, None, "cancelled")
                await stack.aclose()
                replica.breaker.release()
                raise
            else:
                Tracing.attempt_ended(span, 200)
                replica.breaker.record_success()
                return OpenStream(replica, first, _watched(chunks, replica), stack)


def _failed(pool: Pool, replica: Replica, exc: Exception) -> None:
    """A refused or broken connection marks the replica down at once (its probe brings it back). A timeout does
    too while another replica of the pool is available (requests go there), and otherwise counts against its breaker
    only: a replica that times out may be stalled or saturated, still serving its batch, as for slow health checks
    (`backends.clients.pool`), and marking the last one down would fail every request until the next probe (on a
    loaded host, a second-long stall did that: a 503 per request meanwhile). Timeouts that go on open its breaker."""
    replica.breaker.record_failure()
    if not isinstance(exc, EngineTimeout) or any(r.available for r in pool.replicas if r is not replica):
        pool.mark_failed(replica, str(exc))


def _answered(replica: Replica, status: int) -> None:
    """The engine answered with an error status: its own fault (5xx) or the request's (4xx)."""
    if status >= 500:
        replica.breaker.record_failure()
    else:
        replica.breaker.record_success()


async def _watched(chunks: AsyncIterator[bytes], replica: Replica) -> AsyncIterator[bytes]:
    """The rest of a stream; a break after the first chunk counts against the replica's breaker too."""
    try:
        async for chunk in chunks:
            yield chunk
    except EngineStreamBroken:
        replica.breaker.record_failure()
        raise

