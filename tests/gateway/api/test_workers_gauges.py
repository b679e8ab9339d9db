"""`cascade serve --workers 2`: a gauge that is one worker's own view (a replica's circuit breaker and health, the
routing threshold it routes with) shows every worker's value, labelled `worker`, on every scrape, whichever
worker answers; the outbox backlog is one sum. Two real worker processes; the engines are real HTTP servers (the
fake upstream, and one that answers every chat request with a 500 to open a breaker)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.types import Receive, Scope, Send

from loadtest.fake_upstream import FakeUpstream, read_body
from tests.conftest import delete_prefix, policy_yaml
from tests.servers import free_port, serve, wait_ready

pytestmark = pytest.mark.redis
ROOT = Path(__file__).resolve().parents[3]


async def _failing_engine(scope: Scope, receive: Receive, send: Send) -> None:
    """An engine that passes its probes (/health, /metrics) and answers every request with a 500."""
    if scope["type"] != "http":
        return
    await read_body(receive)
    status = 200 if scope["path"] in ("/health", "/metrics") else 500
    body = b"" if status == 200 else b'{"error":{"message":"engine failed","type":"internal"}}'
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


def _policy(micro_url: str, broken_url: str) -> str:
    """The conftest policy whose flagship pool is the failing engine, its breaker opening after two failures."""
    breaker = "\n    breaker: {failure_threshold: 2, cooldown_s: 600}"
    return policy_yaml(micro_url, broken_url).replace("model: flagship-model", "model: flagship-model" + breaker)


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The gateway's base URL and its log (INFO: each request's line, so a slow answer shows where it waited)."""
    prefix = f"test:{uuid.uuid4().hex}:"
    with serve(FakeUpstream("micro-model")) as micro_url, serve(_failing_engine) as broken_url:
        policy = tmp_path / "policy.yaml"
        policy.write_text(_policy(micro_url, broken_url))
        port = free_port()
        cmd = [sys.executable, "-m", "gateway", "serve", "--workers", "2", "--policy", str(policy), "--port", str(port),
               "--scorer", "none", "--no-engines", "--redis-prefix", prefix, "--log-level", "INFO"]
        log = (tmp_path / "gateway.log").open("wb")
        proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "CASCADE_HOME": str(tmp_path)}, stdout=log,
                                stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(url, proc, 90, (tmp_path / "gateway.log").read_text, workers=2)
            yield url, tmp_path / "gateway.log"
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0
            log.close()
            delete_prefix(prefix)


Gauges = dict[tuple[str, str], float]  # (name, worker) -> value


def _scrape(url: str) -> Gauges:
    """The per-worker gauges of the flagship pool (the failing engine) and the routing threshold, and the outbox
    backlog, on one scrape (a new connection: either worker answers)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    wanted = {"cascade_replica_breaker_open", "cascade_replica_healthy", "cascade_routing_threshold",
              "cascade_ledger_outbox_records"}
    return {(s.name, s.labels.get("worker", "")): s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name in wanted and s.labels.get("pool", "flagship") == "flagship"}


def _post(client: httpx.Client, url: str, body: dict[str, object], log: Path) -> int:
    """The status of one chat request; a timeout fails with the gateway's log (twice in about twenty fresh clones
    one of these requests read-timed out at 10 s, under the full suite's load, and its log said nothing: ERROR)."""
    started = time.monotonic()
    try:
        return client.post(url + "/v1/chat/completions", json=body).status_code
    except httpx.TimeoutException as exc:
        waited = time.monotonic() - started
        raise AssertionError(f"{exc!r} after {waited:.1f} s; the gateway's log:\n{log.read_text()[-6000:]}") from exc


def test_each_workers_own_gauges_are_shown_for_every_worker_on_every_scrape(gateway: tuple[str, Path]) -> None:
    url, log = gateway
    body = {"model": "flagship", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
    with httpx.Client(timeout=10) as one_connection:  # keep-alive: every request reaches the same worker
        codes = [_post(one_connection, url, body, log) for _ in range(3)]
    assert codes[:2] == [502, 502]  # two engine failures open that worker's breaker; the other worker saw none
    expected = {("cascade_replica_breaker_open", "0"): 1.0, ("cascade_replica_breaker_open", "1"): 0.0}
    flipped = {("cascade_replica_breaker_open", "0"): 0.0, ("cascade_replica_breaker_open", "1"): 1.0}
    deadline = time.monotonic() + 10
    while True:  # each worker publishes its view every second
        first = _scrape(url)
        breakers = {k: v for k, v in first.items() if k[0] == "cascade_replica_breaker_open"}
        if breakers in (expected, flipped):
            break
        assert time.monotonic() < deadline, f"the breakers never showed one open, one closed: {breakers}"
        time.sleep(0.2)
    assert {k: v for k, v in first.items() if k[0] != "cascade_replica_breaker_open"} == {
        ("cascade_replica_healthy", "0"): 1.0, ("cascade_replica_healthy", "1"): 1.0,
        ("cascade_routing_threshold", "0"): 0.5, ("cascade_routing_threshold", "1"): 0.5,
        ("cascade_ledger_outbox_records", ""): 0.0}
    scrapes = [_scrape(url) for _ in range(16)]  # new connections: both workers answer some (odds 2**-15)
    assert scrapes == [first] * 16
