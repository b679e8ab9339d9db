"""Graceful shutdown of a real gateway process: SIGTERM lets streams in flight finish and flushes their
cost records to the ledger; new connections are refused."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import pytest

from loadtest.scenarios.chaos_figures import ledger_records
from tests.conftest import SHARED_URL
from tests.servers import free_port, start_gateway

pytestmark = pytest.mark.redis


def test_sigterm_finishes_streams_in_flight_and_records_them(policy_file: Path, prefix: str, tmp_path: Path) -> None:
    port = free_port()
    proc = start_gateway(policy_file, port, prefix, tmp_path)
    body = {"model": "flagship", "stream": True, "messages": [{"role": "user", "content": "hi"}],
            "metadata": {"fake_tokens": "60", "fake_delay_ms": "20"}, "stream_options": {"include_usage": True}}
    try:
        with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=30) as r:
            lines = r.iter_lines()
            first = [next(lines) for _ in range(4)]
            proc.send_signal(signal.SIGTERM)
            rest = list(lines)
        assert all(line.startswith("data: ") for line in first if line)
        assert rest[-2:] == ["data: [DONE]", ""] or rest[-1] == "data: [DONE]"
        assert proc.wait(timeout=60) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once drained
    finally:
        if proc.poll() is None:
            proc.kill()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
    entries = ledger_records(SHARED_URL, prefix)
    assert len(entries) == 1
    fields = entries[0]
    assert (fields["status"], fields["completion_tokens"]) == ("ok", "60")
