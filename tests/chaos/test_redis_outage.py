"""Chaos: Redis stops under load, then comes back. Requests keep succeeding, their cost records go to the
local outbox while Redis is away and are replayed when it returns, none counted twice.

Uses a private redis-server on a free port (append-only file on, so that what was recorded before the
outage survives the restart); the shared Redis on 6379 is never touched.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from gateway.api.app import create_app
from gateway.api.runtime import Runtime
from gateway.ledger.store import RedisLedger
from gateway.settings import Settings
from tests.chaos.traffic import Kind, Traffic, reconcile
from tests.conftest import policy_yaml
from tests.servers import free_port, serve

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs the redis-server binary")
Upstreams = tuple[Any, str, Any, str]


class PrivateRedis:
    """A redis-server this test owns (started, stopped and restarted by pid; data in `directory`)."""

    def __init__(self, directory: Path) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._dir = directory
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        cmd = ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(self._dir),
               "--save", "", "--appendonly", "yes", "--appendfsync", "always"]
        self._proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                if redis.Redis.from_url(self.url, socket_timeout=0.5).ping():
                    return
            except redis.RedisError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        """SIGKILL: an abrupt outage (acknowledged writes are in the fsynced append-only file)."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait(timeout=10)
            self._proc = None


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _body(i: int) -> dict[str, Any]:
    return {"model": "micro" if i % 2 else "flagship", "stream": i % 3 == 0,
            "messages": [{"role": "user", "content": "word " * (1 + i % 5)}], "max_tokens": 1 + i % 7,
            "stream_options": {"include_usage": True}, "metadata": {"fake_delay_ms": "5"}}


async def test_redis_outage_under_load_spills_to_the_outbox_and_replays_once(
    tmp_path: Path, upstreams: Upstreams, private_redis: PrivateRedis
) -> None:
    _, micro_url, _, flagship_url = upstreams
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml(micro_url, flagship_url))
    prefix = "chaos:redis:"
    settings = Settings(policy_path=policy, scorer="none", start_engines=False, ledger="redis",
                        redis_url=private_redis.url, redis_prefix=prefix, home=tmp_path, policy_watch_interval_s=0)
    app = create_app(settings)
    with serve(app) as url:
        runtime: Runtime = app.state.runtime
        ledger = runtime.ledger
        assert isinstance(ledger, RedisLedger)
        traffic = Traffic(url, _body, concurrency=4, pause_s=0.01)
        traffic.start()
        await traffic.wait_for(lambda: traffic.count()[Kind.COMPLETED] >= 30, 30, "traffic before the outage")

        private_redis.stop()
        down_at = time.monotonic()
        await traffic.wait_for(lambda: ledger.counts.spilled >= 30, 30, "records spilled to the outbox")
        await traffic.wait_for(lambda: traffic.count(since=down_at + 1)[Kind.COMPLETED] >= 20, 30,
                               "traffic served during the outage")
        assert traffic.count()[Kind.COMPLETED] - traffic.count(since=down_at)[Kind.COMPLETED] >= 30

        await asyncio.to_thread(private_redis.start)
        up_at = time.monotonic()
        await traffic.wait_for(lambda: ledger.counts.replayed + ledger.counts.duplicates >= ledger.counts.spilled,
                               30, "the outbox replay")
        await traffic.wait_for(lambda: traffic.count(since=up_at + 1)[Kind.COMPLETED] >= 20, 30, "traffic after")
        outcomes = await traffic.stop()
        summary = await reconcile(outcomes, private_redis.url, prefix)

    counts = ledger.counts
    kinds = traffic.count()
    print(f"redis outage: {kinds}, ledger {counts}, {summary}")
    assert set(kinds) == {Kind.COMPLETED}, [o for o in outcomes if o.kind is not Kind.COMPLETED][:3]
    assert counts.lost == 0 and counts.spilled >= 30
    assert counts.replayed + counts.duplicates >= counts.spilled
    # A batch cut off by the kill may have been applied before its reply was lost (or a replay cut off
    # by the restart, then claimed again): its replay is then a duplicate, which the ledger's idempotency
    # key absorbs. Either way each completed request is in the ledger exactly once (`reconcile`).
    applied = counts.recorded + counts.replayed
    assert applied <= summary["completed"] <= applied + counts.duplicates
    assert summary["records"] == summary["completed"]
