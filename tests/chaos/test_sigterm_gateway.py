"""Chaos: SIGTERM to a gateway process under load. Streams in flight finish, new requests are refused
cleanly (no connection, never a cut-off answer), the ledger is flushed, and it reconciles with what the
client saw completed."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.traffic import Kind, Traffic, reconcile
from tests.conftest import SHARED_URL
from tests.servers import free_port, start_gateway

pytestmark = pytest.mark.redis
STREAM_S = 1.2  # how long each streamed answer takes (fake engine: 40 tokens, 30 ms apart)


def _body(i: int) -> dict[str, Any]:
    if i % 4 == 3:  # a quick non-streaming request now and then
        return {"model": "micro", "messages": [{"role": "user", "content": f"quick {i}"}], "max_tokens": 4}
    return {"model": "flagship" if i % 2 else "micro", "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": f"long answer {i}"}],
            "metadata": {"fake_tokens": "40", "fake_delay_ms": str(int(STREAM_S * 1000 / 40))}}


async def test_sigterm_under_load_drains_streams_refuses_new_and_flushes_the_ledger(
    policy_file: Path, prefix: str, tmp_path: Path
) -> None:
    port = free_port()
    env = {"CASCADE_REDIS_URL": SHARED_URL}
    proc = await asyncio.to_thread(start_gateway, policy_file, port, prefix, tmp_path, env)
    traffic = Traffic(f"http://127.0.0.1:{port}", _body, concurrency=8, timeout_s=30, pause_s=0.02)
    try:
        traffic.start()
        await traffic.wait_for(lambda: traffic.count()[Kind.COMPLETED] >= 16, 60, "traffic before SIGTERM")
        await asyncio.sleep(STREAM_S / 2)  # streams are mid-answer now
        proc.send_signal(signal.SIGTERM)
        sigterm_at = time.monotonic()
        code = await asyncio.to_thread(proc.wait, 60)
        exited_after = time.monotonic() - sigterm_at
        await asyncio.sleep(0.3)  # a few requests against the closed port
        outcomes = await traffic.stop()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code in (0, -signal.SIGTERM)
    kinds = traffic.count()
    broken = [o for o in outcomes if o.kind in (Kind.BROKEN, Kind.FAILED)]
    assert not broken, broken[:3]
    in_flight = [o for o in outcomes if o.started < sigterm_at - 0.2 and o.ended > sigterm_at]
    assert len([o for o in in_flight if o.stream]) >= 4, in_flight
    assert all(o.kind is Kind.COMPLETED for o in in_flight), [o for o in in_flight if o.kind is not Kind.COMPLETED]
    assert all(o.kind is Kind.REFUSED for o in outcomes if o.started > sigterm_at + exited_after), kinds
    assert kinds[Kind.REFUSED] >= 1
    summary = await reconcile(outcomes, SHARED_URL, prefix, settle_s=0)  # flushed before exit: no waiting
    print(f"sigterm: exited {exited_after:.2f} s after SIGTERM; {len(in_flight)} in flight; {kinds}; {summary}")
    assert summary["ok_records"] == kinds[Kind.COMPLETED]
