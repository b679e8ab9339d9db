"""Batch lines priced at the pool's batch discount and recorded with their batch id and custom_id, in their own row
of the cost report by endpoint and in `cascade costs batch <id>`; their counts and the lane in `/metrics`; a batch
past its completion window expired as OpenAI expires one."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest
import redis

from gateway.batches.running import BatchParts
from loadtest.scenarios.chaos_figures import ledger_records
from policies.batches import discounted
from tests.conftest import SHARED_URL, GatewayFactory, Upstreams, report_recent
from tests.gateway.batches.test_batch_api import (
    A,
    batch_policy,
    chat_line,
    create,
    finished,
    jsonl,
    on_loop,
    started,
    upload,
)
from tests.gateway.costs.test_costs_report import run_cli
from tests.harness import Gateway
from tests.servers import until

pytestmark = pytest.mark.redis


@pytest.fixture
def gateway(make_gateway: GatewayFactory, tmp_path: Path, fake_upstreams: Upstreams, prefix: str) -> Gateway:
    policy = batch_policy(tmp_path, fake_upstreams, "batches: {pool_discounts: {flagship: 0.25}}\n")
    return make_gateway(policy, ledger="redis", redis_prefix=prefix)


def _records(prefix: str, n: int) -> list[dict[str, str]]:
    until(lambda: len(ledger_records(SHARED_URL, prefix)) >= n, 10, lambda: "ledger records missing")
    return ledger_records(SHARED_URL, prefix)


def test_a_batch_line_costs_its_pools_price_less_the_discount_in_a_row_of_its_own(
        gateway: Gateway, prefix: str, capsys: pytest.CaptureFixture[str]) -> None:
    for pool in ("micro", "flagship"):
        body = chat_line("x", model=pool, content="the same question")["body"]
        assert gateway.client.post("/v1/chat/completions", headers=A, json=body).status_code == 200
    lines = [chat_line("cheap", content="the same question"),
             chat_line("dear", model="flagship", content="the same question")]
    done = finished(gateway, create(gateway, upload(gateway, jsonl(lines)).json()["id"]).json()["id"])
    records = _records(prefix, 4)
    interactive = {r["pool"]: int(r["cost_micro_usd"]) for r in records if not r["batch_id"]}
    batch = {r["custom_id"]: r for r in records if r["batch_id"] == done["id"]}
    assert interactive["micro"] > 0 and interactive["flagship"] > 0
    assert int(batch["cheap"]["cost_micro_usd"]) == discounted(interactive["micro"], 0.5)
    assert int(batch["dear"]["cost_micro_usd"]) == discounted(interactive["flagship"], 0.25)
    assert {r["endpoint"] for r in batch.values()} == {"chat"}
    rows = {row.key: row.counters for row in asyncio.run(report_recent(prefix)).rows("endpoint")}
    assert set(rows) == {"chat", "batch"} and rows["chat"].requests == 2 and rows["batch"].requests == 2
    assert rows["batch"].cost_micro_usd == sum(int(r["cost_micro_usd"]) for r in batch.values())
    assert rows["batch"].flagship_cost_micro_usd == 2 * discounted(interactive["flagship"], 0.25)
    assert run_cli("costs", "batch", done["id"], "--prefix", prefix, "--format", "json") == 0
    spend = orjson.loads(capsys.readouterr().out)
    assert (spend["tenant"], spend["status"], spend["lines"]) == ("a", "completed", 2)
    by_pool = {row["pool"]: row for row in spend["rows"]}
    assert by_pool["micro"]["cost_micro_usd"] == int(batch["cheap"]["cost_micro_usd"])
    assert by_pool["TOTAL"]["cost_micro_usd"] == rows["batch"].cost_micro_usd and by_pool["TOTAL"]["requests"] == 2
    assert run_cli("costs", "batch", done["id"], "--prefix", prefix) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("TOTAL")
    assert run_cli("costs", "batch", "batch_nope", "--prefix", prefix) == 2
    assert "no batch batch_nope" in capsys.readouterr().err
    metrics = gateway.client.get("/metrics").text
    assert 'cascade_batch_lines_total{status="completed"} 2.0' in metrics
    assert 'cascade_batch_lane_in_flight{pool="micro"} 0.0' in metrics and "cascade_batch_lane_waiting 0.0" in metrics


def _parts(gateway: Gateway) -> BatchParts:
    parts = gateway.runtime.batches
    assert parts is not None
    return parts


def test_a_batch_past_its_window_expires_with_its_unanswered_lines_in_the_error_file(gateway: Gateway) -> None:
    parts = _parts(gateway)
    on_loop(gateway, parts.worker.aclose())
    batch = create(gateway, upload(gateway, jsonl([chat_line("a"), chat_line("b")])).json()["id"]).json()
    with redis.Redis.from_url(SHARED_URL) as client:  # its window over: it ends at the next sweep
        client.hset(parts.store.key("batch", batch["id"]), "expires_at", batch["created_at"])
    on_loop(gateway, started(parts.worker))
    done = finished(gateway, batch["id"])
    assert done["status"] == "expired" and done["expired_at"] and done["output_file_id"] is None
    errors = [orjson.loads(x) for x in gateway.client.get(f"/v1/files/{done['error_file_id']}/content",
                                                            headers=A).content.splitlines()]
    assert [(e["custom_id"], e["error"]["code"], e["response"]) for e in errors] == [
        ("a", "batch_expired", None), ("b", "batch_expired", None)]


def test_batch_lines_wait_while_the_engines_queue_and_run_once_it_drains(
        make_gateway: GatewayFactory, tmp_path: Path, fake_upstreams: Upstreams, prefix: str) -> None:
    micro = fake_upstreams[0]
    micro.waiting = 3.0  # interactive requests queue on the engine (as its /metrics says)
    policy = batch_policy(tmp_path, fake_upstreams, "batches: {max_queue: 0, max_wait_s: 0.2}\n")
    gateway = make_gateway(policy, ledger="redis", redis_prefix=prefix, probe_interval_s=0.1)
    batch = create(gateway, upload(gateway, jsonl([chat_line("a"), chat_line("b")])).json()["id"]).json()

    def requeued() -> float:
        value = gateway.runtime.metrics.registry.get_sample_value("cascade_batch_lines_total", {"status": "requeued"})
        return value or 0.0

    until(lambda: requeued() >= 2, 10, lambda: "no line went back to the queue")
    assert micro.requests == 0  # nothing sent while the engine queues
    assert gateway.client.get(f"/v1/batches/{batch['id']}", headers=A).json()["request_counts"]["completed"] == 0
    micro.waiting = 0.0
    done = finished(gateway, batch["id"])
    assert done["status"] == "completed" and micro.requests == 2
