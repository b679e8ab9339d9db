"""End to end with the official `openai` SDK: `cascade serve` in its own process, over fake engines in theirs
(`python -m loadtest.fake_upstream`), the real Redis. The SDK's file and batch calls work unchanged: upload, create,
retrieve until completed, the output file's content, list, cancel refused for a finished batch, delete; an upload's
`expires_after`."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import orjson
import pytest

from tests.conftest import policy_yaml
from tests.gateway.batches.test_batch_api import TENANTS, chat_line, jsonl
from tests.servers import free_port, start_fake_upstream, start_gateway

pytestmark = pytest.mark.redis


@pytest.fixture
def served(tmp_path: Path, prefix: str) -> Iterator[str]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        micro, micro_url = start_fake_upstream("micro-model")
        procs.append(micro)
        flagship, flagship_url = start_fake_upstream("flagship-model")
        procs.append(flagship)
        policy = tmp_path / "policy.yaml"
        policy.write_text(policy_yaml(micro_url, flagship_url, TENANTS))
        port = free_port()
        procs.append(start_gateway(policy, port, prefix, tmp_path / "home"))
        yield f"http://127.0.0.1:{port}"
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)


def test_the_openai_sdk_runs_a_batch_through_the_served_gateway(served: str) -> None:
    client = openai.OpenAI(base_url=served + "/v1", api_key="sk-team-a", max_retries=0)
    lines = [chat_line("small", content="what is two plus two"), chat_line("big", model="flagship"),
             chat_line("routed", model="auto", content="summarise the plot of a long novel in detail")]
    file = client.files.create(file=("input.jsonl", jsonl(lines)), purpose="batch")
    assert file.purpose == "batch" and file.bytes == len(jsonl(lines))
    assert file.expires_at == file.created_at + 30 * 86_400  # the policy's default `batches.file_ttl_days`
    hour = client.files.create(file=("input.jsonl", jsonl(lines)), purpose="batch",
                               expires_after={"anchor": "created_at", "seconds": 3600})
    assert hour.expires_at == hour.created_at + 3600
    with pytest.raises(openai.BadRequestError, match=r"expires_after\[seconds\]"):
        client.files.create(file=("input.jsonl", jsonl(lines)), purpose="batch",
                            expires_after={"anchor": "created_at", "seconds": 60})
    batch = client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h",
                                  metadata={"job": "sdk"})
    assert batch.status == "in_progress" and batch.metadata == {"job": "sdk"}
    deadline = time.monotonic() + 30
    while batch.status not in ("completed", "failed", "expired", "cancelled") and time.monotonic() < deadline:
        time.sleep(0.2)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed", batch
    assert batch.request_counts is not None and batch.request_counts.completed == 3
    assert batch.output_file_id is not None and batch.error_file_id is None
    assert batch.usage is not None and batch.usage.total_tokens > 0
    output = [orjson.loads(line) for line in client.files.content(batch.output_file_id).text.splitlines()]
    assert sorted(o["custom_id"] for o in output) == ["big", "routed", "small"]
    models = {o["custom_id"]: o["response"]["body"]["model"] for o in output}
    assert models["small"] == "micro-model" and models["big"] == "flagship-model"
    assert all(o["response"]["body"]["choices"][0]["message"]["content"] for o in output)
    assert [b.id for b in client.batches.list(limit=5)] == [batch.id]
    with pytest.raises(openai.BadRequestError):
        client.batches.cancel(batch.id)
    other = openai.OpenAI(base_url=served + "/v1", api_key="sk-team-b", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        other.batches.retrieve(batch.id)
    assert client.files.delete(file.id).deleted
