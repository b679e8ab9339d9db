"""The per-replica circuit breaker through the real gateway (uvicorn) in front of two fake engines: one
that passes its health checks but breaks every chat request, one that works."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
from starlette.types import Receive, Scope, Send

from backends.clients.breaker import BreakerConfig, BreakerState, CircuitBreaker
from gateway.api.app import create_app
from gateway.api.runtime import Runtime
from gateway.settings import Settings
from loadtest.fake_upstream import FakeUpstream
from tests.conftest import Upstreams, policy_yaml
from tests.servers import serve

COOLDOWN_S = 2.5


def _state(breaker: CircuitBreaker) -> BreakerState:
    """Read afresh (the state changes under mypy's feet: it is time-driven)."""
    return breaker.state


class Flaky:
    """A fake engine whose chat answers break off after their headers while `broken` (health stays 200)."""

    def __init__(self) -> None:
        self.inner = FakeUpstream("micro-model")
        self.broken = True
        self.chat_attempts = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/v1/chat/completions":
            self.chat_attempts += 1
            if self.broken:
                await send({"type": "http.response.start", "status": 200,
                            "headers": [(b"content-type", b"application/json"), (b"content-length", b"1000")]})
                raise ConnectionAbortedError("engine died mid-answer (test)")
        await self.inner(scope, receive, send)


def _chat(url: str, i: int) -> httpx.Response:
    body = {"model": "micro", "stream": i % 2 == 1, "messages": [{"role": "user", "content": f"hello {i}"}]}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=10)


def test_breaker_opens_on_a_failing_replica_then_a_probe_closes_it(tmp_path: Path, upstreams: Upstreams) -> None:
    good, good_url, _, flagship_url = upstreams
    flaky = Flaky()
    with serve(flaky) as flaky_url:
        path = tmp_path / "p.yaml"
        breaker = f"breaker: {{failure_threshold: 3, cooldown_s: {COOLDOWN_S}}}"  # the policy sets it
        path.write_text(policy_yaml(good_url, flagship_url).replace(
            f'urls: ["{good_url}"]', f'urls: ["{flaky_url}", "{good_url}"]\n    {breaker}'))
        settings = Settings(policy_path=path, scorer="none", start_engines=False, ledger="memory", home=tmp_path,
                            probe_interval_s=0.05, policy_watch_interval_s=0)
        app = create_app(settings)
        with serve(app) as url:
            runtime: Runtime = app.state.runtime
            bad = runtime.pools["micro"].replicas[0]
            assert bad.breaker.config == BreakerConfig(failure_threshold=3, cooldown_s=COOLDOWN_S)
            bad.in_flight = -100  # always the least loaded: chosen first whenever it is available

            # Every failed attempt fails over to the good replica: the client never sees the broken one.
            sent = 0
            while flaky.chat_attempts < 3 and sent < 200:
                assert _chat(url, sent).status_code == 200
                sent += 1
                time.sleep(0.06)  # let the health probe mark the broken replica healthy again
            assert flaky.chat_attempts == 3
            assert _state(bad.breaker) is BreakerState.OPEN
            opened = time.monotonic()
            metrics = httpx.get(url + "/metrics").text
            assert f'cascade_replica_breaker_open{{pool="micro",replica="{bad.url}"}} 1.0' in metrics

            # Open: although its health checks pass, the broken replica gets nothing during the cool-down.
            before = good.requests
            while time.monotonic() - opened < COOLDOWN_S * 0.6:
                assert _chat(url, sent).status_code == 200
                sent += 1
            assert flaky.chat_attempts == 3 and bad.healthy
            assert good.requests - before >= 3

            # Half-open after the cool-down: one probe request; it fails, so the breaker re-opens.
            time.sleep(max(0.0, opened + COOLDOWN_S - time.monotonic()) + 0.05)
            assert _state(bad.breaker) is BreakerState.HALF_OPEN
            assert httpx.get(url + "/readyz").status_code == 200
            assert _chat(url, sent).status_code == 200
            sent += 1
            assert flaky.chat_attempts == 4 and _state(bad.breaker) is BreakerState.OPEN

            # Repaired: the next probe succeeds, the breaker closes and the replica takes traffic again.
            flaky.broken = False
            time.sleep(COOLDOWN_S + 0.1)
            for _ in range(4):
                assert _chat(url, sent).status_code == 200
                sent += 1
            assert _state(bad.breaker) is BreakerState.CLOSED
            assert flaky.chat_attempts == 8 and flaky.inner.requests == 4
