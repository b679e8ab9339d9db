"""A batch through a real vLLM engine (the shipped demo micro, shared), with the official openai SDK, beside a steady
open-loop interactive load (4 requests a second): every line answered by the engine and recorded once at the batch
discount, the lane sending a line only while no interactive request is in flight on the pool (`max_interactive: 0`).
The interactive times to first token with the batch and, first, with the same load alone are printed: on this shared
two-core machine they are a smoke figure, not the issue's measurement."""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest

from loadtest.studies.batch_priority import study_policy
from policies.batches import discounted
from policies.loader import load_policy
from policies.pools import LocalPool
from tests.conftest import SHARED_URL, delete_prefix
from tests.engines import SharedEngines, gateway_on_shared_engines
from tests.servers import ROOT, until

pytestmark = [pytest.mark.engines, pytest.mark.redis]
LINES = 40
ALONE_S = 5.0  # a smoke figure (printed, not asserted): 20 requests; 15 s held the engine tests 10 s longer
INTERVAL_S = 0.25  # the interactive load: 4 requests a second, open loop


@pytest.fixture
def prefix() -> Iterator[str]:
    value = f"test:e2e-batches:{uuid.uuid4().hex[:8]}:"
    yield value
    delete_prefix(value)


def _one(client: openai.OpenAI, ttfts: list[float]) -> None:
    started = time.monotonic()
    stream = client.chat.completions.create(model="micro", max_tokens=8, stream=True,
                                            messages=[{"role": "user", "content": "Say hello."}])
    for _ in stream:
        ttfts.append(time.monotonic() - started)
        break
    for _ in stream:
        pass


def _interactive(client: openai.OpenAI, stop: threading.Event, ttfts: list[float]) -> None:
    """Steady open-loop load: one request every `INTERVAL_S`, whether or not the last has been answered."""
    sent: list[threading.Thread] = []
    while not stop.wait(INTERVAL_S):
        one = threading.Thread(target=_one, args=(client, ttfts), daemon=True)
        one.start()
        sent.append(one)
    for one in sent:
        one.join(60)


def _ttfts_for(client: openai.OpenAI, seconds: float) -> list[float]:
    stop, ttfts = threading.Event(), list[float]()
    load = threading.Thread(target=_interactive, args=(client, stop, ttfts), daemon=True)
    load.start()
    time.sleep(seconds)
    stop.set()
    load.join(120)
    return ttfts


def _figures(ttfts: list[float]) -> str:
    ordered = sorted(ttfts)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return f"median {statistics.median(ordered) * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms"


def test_a_batch_runs_on_a_real_engine_beside_interactive_requests(shared_engines: SharedEngines, tmp_path: Path,
                                                                   prefix: str) -> None:
    shipped = load_policy(ROOT / "policies" / "default.yaml").policy.pools["micro"]
    assert isinstance(shipped, LocalPool)
    policy = tmp_path / "policy.yaml"
    policy.write_text(study_policy(shipped.engine.model_dump_json(exclude_defaults=True), None,
                                   "lines_in_flight: 1, max_queue: 0, max_kv: 0.9, max_interactive: 0"))
    args = ["--scorer", "length", "--home", str(tmp_path)]
    with gateway_on_shared_engines(shared_engines, policy, prefix, args) as gateway:
        client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        lines: list[dict[str, Any]] = [{"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions",
                  "body": {"model": "micro", "max_tokens": 16,
                           "messages": [{"role": "user", "content": f"Name a colour, number {i}."}]}}
                 for i in range(LINES)]
        content = b"".join(orjson.dumps(line) + b"\n" for line in lines)
        alone = _ttfts_for(client, ALONE_S)  # the same interactive load without a batch, first
        stop, ttfts = threading.Event(), list[float]()
        load = threading.Thread(target=_interactive, args=(client, stop, ttfts), daemon=True)
        load.start()
        try:
            file = client.files.create(file=("lines.jsonl", content), purpose="batch")
            batch = client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions",
                                          completion_window="24h")
            started = time.monotonic()
            until(lambda: client.batches.retrieve(batch.id).status == "completed", 600,
                  lambda: f"batch: {client.batches.retrieve(batch.id)}")
            took = time.monotonic() - started
        finally:
            stop.set()
            load.join(120)
        done = client.batches.retrieve(batch.id)
        assert done.request_counts is not None and done.request_counts.completed == LINES
        assert done.output_file_id is not None
        out = [orjson.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]
        assert sorted(o["custom_id"] for o in out) == sorted(line["custom_id"] for line in lines)
        assert all(o["response"]["body"]["choices"][0]["message"]["content"] for o in out)
        assert ttfts, "no interactive request was answered while the batch ran"
        from loadtest.scenarios.chaos_figures import ledger_records

        until(lambda: sum(r.get("batch_id") == batch.id for r in ledger_records(SHARED_URL, prefix)) >= LINES, 30)
        records = [r for r in ledger_records(SHARED_URL, prefix) if r.get("batch_id") == batch.id]
        assert len(records) == LINES and len({r["request_id"] for r in records}) == LINES
        price = load_policy(policy).policy.pools["micro"].price
        assert all(int(r["cost_micro_usd"]) == discounted(price.cost_micro_usd(int(r["prompt_tokens"]),
                                                                                int(r["completion_tokens"])), 0.5)
                   for r in records)
        print(f"\nbatch of {LINES} lines in {took:.1f} s beside {len(ttfts)} interactive requests (4/s, open loop); "
              f"interactive TTFT with the batch {_figures(ttfts)}; alone, {len(alone)} requests in {ALONE_S:g} s: "
              f"{_figures(alone)}")
