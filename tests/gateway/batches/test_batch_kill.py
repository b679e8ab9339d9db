"""A gateway killed (SIGKILL) mid-batch and another started on the same Redis and batch folder: the batch finishes,
every line answered once and billed once. `cascade serve` processes over fake engine processes, the real Redis."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import openai
import orjson
import pytest

from loadtest.scenarios.chaos_figures import ledger_records
from tests.conftest import SHARED_URL, policy_yaml
from tests.gateway.batches.test_batch_api import TENANTS, chat_line, jsonl
from tests.servers import free_port, start_fake_upstream, start_gateway, until

pytestmark = pytest.mark.redis
LINES = 60


@pytest.fixture
def engines() -> Iterator[tuple[str, str]]:
    procs = [start_fake_upstream("micro-model", delay_ms=30), start_fake_upstream("flagship-model", delay_ms=30)]
    try:
        yield procs[0][1], procs[1][1]
    finally:
        for proc, _ in procs:
            proc.terminate()
            proc.wait(30)


def test_a_gateway_killed_mid_batch_leaves_the_next_to_finish_it_every_line_once(
        engines: tuple[str, str], tmp_path: Path, prefix: str) -> None:
    policy = tmp_path / "policy.yaml"
    batches = f"batches: {{claim_after_s: 2, lines_in_flight: 4, folder: '{tmp_path / 'batch-files'}'}}\n"
    policy.write_text(policy_yaml(*engines, TENANTS + batches))
    port = free_port()
    first = start_gateway(policy, port, prefix, tmp_path / "first")
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-team-a", max_retries=0)
    lines = [chat_line(f"line-{i}", content=f"question {i}") for i in range(LINES)]
    file = client.files.create(file=("input.jsonl", jsonl(lines)), purpose="batch")
    batch = client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h")

    def answered() -> int:
        counts = client.batches.retrieve(batch.id).request_counts
        return 0 if counts is None else counts.completed

    until(lambda: answered() >= 5, 30, lambda: "the first gateway answered no line")
    before = answered()
    os.kill(first.pid, signal.SIGKILL)  # mid-batch: lines in flight, never acknowledged nor given back
    first.wait(10)
    assert before < LINES - 8
    second = start_gateway(policy, port, prefix, tmp_path / "second")
    try:
        deadline = time.monotonic() + 60
        while client.batches.retrieve(batch.id).status != "completed" and time.monotonic() < deadline:
            time.sleep(0.2)
        done = client.batches.retrieve(batch.id)
        assert done.status == "completed" and done.request_counts is not None
        assert (done.request_counts.completed, done.request_counts.failed) == (LINES, 0)
        assert done.output_file_id is not None
        out = [orjson.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]
        assert Counter(o["custom_id"] for o in out) == Counter({f"line-{i}": 1 for i in range(LINES)})
        def records() -> list[dict[str, str]]:
            return [r for r in ledger_records(SHARED_URL, prefix) if r.get("batch_id") == batch.id]

        until(lambda: len(records()) >= LINES, 15, lambda: f"{len(records())} records")
        assert Counter(r["custom_id"] for r in records()) == Counter({f"line-{i}": 1 for i in range(LINES)})
    finally:
        second.terminate()
        second.wait(30)
