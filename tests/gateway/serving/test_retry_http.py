"""Retry of an engine's 5xx on another replica, through the real gateway (uvicorn) in front of fake engines:
one replica whose chat answers are an HTTP 500 (health stays 200), one that works."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import orjson
import pytest
from starlette.types import Receive, Scope, Send

from backends.clients.breaker import BreakerConfig, BreakerState
from backends.clients.pool import Replica
from gateway.api.app import create_app
from gateway.api.runtime import Runtime
from gateway.settings import Settings
from loadtest.fake_upstream import FakeUpstream
from tests.conftest import Upstreams, policy_yaml
from tests.servers import serve

_ERROR = orjson.dumps({"error": {"message": "engine core died (test)", "type": "InternalServerError"}})


class Failing:
    """A fake engine: chat answers are `status` (or, with `first_chunk_then_die`, one SSE chunk and then a
    dropped connection); everything else (health, metrics) is the working fake's."""

    def __init__(self, status: int = 500, first_chunk_then_die: bool = False, delay_s: float = 0.0) -> None:
        self.inner = FakeUpstream("micro-model")
        self.status = status
        self.delay_s = delay_s
        self.first_chunk_then_die = first_chunk_then_die
        self.chat_attempts = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/chat/completions":
            return await self.inner(scope, receive, send)
        self.chat_attempts += 1
        await asyncio.sleep(self.delay_s)
        if self.first_chunk_then_die:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")]})
            chunk = {"id": "x", "object": "chat.completion.chunk", "model": "micro-model",
                     "choices": [{"index": 0, "delta": {"role": "assistant", "content": "half"}}]}
            await send({"type": "http.response.body", "body": b"data: " + orjson.dumps(chunk) + b"\n\n",
                        "more_body": True})
            raise ConnectionAbortedError("engine died after its first chunk (test)")
        await send({"type": "http.response.start", "status": self.status,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": _ERROR})
        return None


@contextmanager
def _gateway(tmp_path: Path, micro_urls: list[str], flagship_url: str,
             deadline_s: float = 60.0) -> Iterator[tuple[str, list[Replica]]]:
    """A gateway whose micro pool has `micro_urls` (the first always preferred while available)."""
    path = tmp_path / "p.yaml"
    urls = ", ".join(f'"{u}"' for u in micro_urls)
    path.write_text(policy_yaml(micro_urls[0], flagship_url).replace(
        f'urls: ["{micro_urls[0]}"]', f"urls: [{urls}]\n    breaker: {{failure_threshold: 2, cooldown_s: 60}}"))
    settings = Settings(policy_path=path, scorer="none", start_engines=False, ledger="memory", home=tmp_path,
                        probe_interval_s=0.05, policy_watch_interval_s=0, deadline_s=deadline_s)
    app = create_app(settings)
    with serve(app) as url:
        runtime: Runtime = app.state.runtime
        replicas = runtime.pools["micro"].replicas
        replicas[0].in_flight = -100  # the least loaded: chosen first whenever it is available
        yield url, replicas


def _chat(url: str, stream: bool) -> httpx.Response:
    body = {"model": "micro", "stream": stream, "messages": [{"role": "user", "content": "hello"}]}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=10)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_5xx_is_retried_on_another_replica_and_counts_against_the_breaker(
        tmp_path: Path, upstreams: Upstreams, stream: bool) -> None:
    good, good_url, _, flagship_url = upstreams
    failing = Failing(500)
    with serve(failing) as bad_url, _gateway(tmp_path, [bad_url, good_url], flagship_url) as (url, replicas):
        bad = replicas[0]
        assert bad.breaker.config == BreakerConfig(failure_threshold=2, cooldown_s=60)
        for expected_attempts in (1, 2):
            reply = _chat(url, stream)
            assert reply.status_code == 200, reply.text
            assert "micro-model" in reply.text and "engine core died" not in reply.text
            assert failing.chat_attempts == expected_attempts
        assert good.requests == 2
        assert bad.breaker.state is BreakerState.OPEN  # two 5xx in a row: the breaker was told each time
        assert bad.healthy  # it answered: a 5xx is the breaker's business, not the health probe's
        assert _chat(url, stream).status_code == 200
        assert failing.chat_attempts == 2  # open: not tried any more


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_when_every_replica_answers_5xx_the_client_gets_a_502_with_the_engines_message(
        tmp_path: Path, upstreams: Upstreams, stream: bool) -> None:
    _, _, _, flagship_url = upstreams
    first, second = Failing(500), Failing(503)
    with serve(first) as a, serve(second) as b, _gateway(tmp_path, [a, b], flagship_url) as (url, _):
        reply = _chat(url, stream)
        assert reply.status_code == 502, reply.text
        error = reply.json()["error"]
        assert error["code"] == "upstream_rejected" and "engine core died" in error["message"]
        assert "HTTP 503" in error["message"]  # the last replica's answer
        assert first.chat_attempts == 1 and second.chat_attempts == 1


def test_a_4xx_is_not_retried(tmp_path: Path, upstreams: Upstreams) -> None:
    good, good_url, _, flagship_url = upstreams
    failing = Failing(400)
    with serve(failing) as bad_url, _gateway(tmp_path, [bad_url, good_url], flagship_url) as (url, replicas):
        assert _chat(url, stream=False).status_code == 400
        assert failing.chat_attempts == 1 and good.requests == 0
        assert replicas[0].breaker.state is BreakerState.CLOSED


def test_a_stream_that_breaks_after_its_first_chunk_is_not_retried(tmp_path: Path, upstreams: Upstreams) -> None:
    good, good_url, _, flagship_url = upstreams
    failing = Failing(first_chunk_then_die=True)
    with serve(failing) as bad_url, _gateway(tmp_path, [bad_url, good_url], flagship_url) as (url, _):
        reply = _chat(url, stream=True)
        assert "half" in reply.text  # the client got the first chunk...
        assert failing.chat_attempts == 1 and good.requests == 0  # ...so nothing was sent again elsewhere


def test_retries_stop_at_the_request_deadline(tmp_path: Path, upstreams: Upstreams) -> None:
    _, _, _, flagship_url = upstreams
    slow = [Failing(500, delay_s=0.8) for _ in range(3)]  # three slow 5xx: 2.4 s of tries against a 1.5 s deadline
    with serve(slow[0]) as a, serve(slow[1]) as b, serve(slow[2]) as c, \
            _gateway(tmp_path, [a, b, c], flagship_url, deadline_s=1.5) as (url, _):
        started = time.monotonic()
        reply = _chat(url, stream=False)
        took = time.monotonic() - started
        assert reply.status_code == 504 and reply.json()["error"]["code"] == "deadline_exceeded", reply.text
        assert took < 2.3
        assert 1 <= sum(f.chat_attempts for f in slow) <= 2  # the third try was never started
