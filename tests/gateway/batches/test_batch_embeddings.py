"""`/v1/embeddings` batch lines through the embeddings service an interactive request uses, in-process over fake
engines (`loadtest.fake_embeddings` answers the embedding pool) and the real Redis: every line answered once with
the engine's embeddings list, billed once at the pool's batch discount in the `batch` row; the lane's headroom on
the embedding pool; a tenant no embedding pool serves answered per line with the interactive request's error."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.api.auth import hash_key
from gateway.batches.running import BatchParts
from loadtest.fake_embeddings import vector_of
from loadtest.fake_upstream import FakeUpstream
from loadtest.scenarios.chaos_figures import ledger_records
from policies.batches import discounted
from tests.conftest import SHARED_URL, GatewayFactory, Upstreams, report_recent
from tests.gateway.batches.test_batch_api import TENANTS, A, batch_policy, finished, jsonl, on_loop, upload
from tests.gateway.serving.test_embeddings_http import embedding_policy
from tests.harness import FakeEngines, Gateway
from tests.servers import until

pytestmark = pytest.mark.redis
PER_TOKEN = 100  # micro-USD an input token ("100.00" USD per million): a line's cost is not rounded away
C = {"authorization": "Bearer sk-team-c"}
LIMITED = f"  c: {{api_key_sha256: ['{hash_key('sk-team-c')}'], allowed_pools: [micro, flagship]}}\n"


@pytest.fixture
def embedder(fake_engines: FakeEngines) -> tuple[FakeUpstream, str]:
    engine = FakeUpstream("embed-model")
    return engine, fake_engines.add("embed", engine)


def _policy(tmp_path: Path, upstreams: Upstreams, embed_url: str, batches: str, name: str = "policy.yaml") -> Path:
    path = tmp_path / name
    text = embedding_policy(upstreams, embed_url, extra=TENANTS + LIMITED + batches)
    path.write_text(text.replace('input_per_mtok: "0.02"', 'input_per_mtok: "100.00"'))
    return path


def embed_line(custom_id: str, given: Any, model: str = "embed", **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings",
            "body": {"model": model, "input": given, **body}}


def _run(gateway: Gateway, lines: list[dict[str, Any]], headers: dict[str, str] = A,
         timeout_s: float = 60.0) -> dict[str, Any]:
    body = {"input_file_id": upload(gateway, jsonl(lines), headers).json()["id"], "endpoint": "/v1/embeddings",
            "completion_window": "24h"}
    created = gateway.client.post("/v1/batches", headers=headers, json=body)
    assert created.status_code == 200, created.text
    return finished(gateway, created.json()["id"], headers, timeout_s)  # type: ignore[no-any-return]


def _file(gateway: Gateway, file_id: str, headers: dict[str, str] = A) -> list[dict[str, Any]]:
    return [orjson.loads(x) for x in gateway.client.get(f"/v1/files/{file_id}/content", headers=headers)
            .content.splitlines()]


def _batch_records(prefix: str, batch_id: str, n: int) -> list[dict[str, str]]:
    def mine() -> list[dict[str, str]]:
        return [r for r in ledger_records(SHARED_URL, prefix) if r.get("batch_id") == batch_id]

    until(lambda: len(mine()) >= n, 10, lambda: "ledger records missing")
    return mine()


def _parts(gateway: Gateway) -> BatchParts:
    parts = gateway.runtime.batches
    assert parts is not None
    return parts


INPUTS: dict[str, Any] = {"one": "a single text", "two": ["first text", "and a second"], "ids": [5, 6, 7],
                          "auto": "routed by auto"}


def test_an_embeddings_batch_answers_every_line_once_billed_once_at_the_pools_discount(
        make_gateway: GatewayFactory, tmp_path: Path, fake_upstreams: Upstreams, embedder: tuple[FakeUpstream, str],
        prefix: str) -> None:
    policy = _policy(tmp_path, fake_upstreams, embedder[1], "batches: {pool_discounts: {embed: 0.25}}\n")
    gateway = make_gateway(policy, ledger="redis", redis_prefix=prefix)
    interactive = gateway.client.post("/v1/embeddings", headers=A, json={"model": "embed", "input": "a single text"})
    assert interactive.status_code == 200, interactive.text
    lines = [embed_line(name, given, model="auto" if name == "auto" else "embed", encoding_format="float")
             for name, given in INPUTS.items()]
    done = _run(gateway, lines)
    assert done["status"] == "completed" and done["endpoint"] == "/v1/embeddings"
    assert done["request_counts"] == {"total": 4, "completed": 4, "failed": 0} and done["error_file_id"] is None
    out = {o["custom_id"]: o for o in _file(gateway, done["output_file_id"])}
    assert sorted(out) == sorted(INPUTS) and len(_file(gateway, done["output_file_id"])) == 4  # each line once
    for name, given in INPUTS.items():
        response = out[name]["response"]
        assert response["status_code"] == 200 and out[name]["error"] is None
        assert response["request_id"] == f"req_{done['id']}_{list(INPUTS).index(name)}"
        body = response["body"]  # the engine's embeddings list object, as OpenAI's batch output has it
        assert body["object"] == "list" and body["model"] == "embed-model"
        items = given if isinstance(given, list) and isinstance(given[0], str) else [given]
        assert [d["embedding"] for d in body["data"]] == [vector_of(i) for i in items]
    tokens = {name: o["response"]["body"]["usage"]["prompt_tokens"] for name, o in out.items()}
    assert done["usage"]["input_tokens"] == sum(tokens.values()) > 0 and done["usage"]["output_tokens"] == 0
    records = _batch_records(prefix, done["id"], 4)
    assert Counter(r["custom_id"] for r in records) == Counter(list(INPUTS))  # billed once a line
    for rec in records:
        assert (rec["endpoint"], rec["pool"], rec["status"]) == ("embeddings", "embed", "ok")
        full = int(rec["prompt_tokens"]) * PER_TOKEN
        assert int(rec["prompt_tokens"]) == tokens[rec["custom_id"]]
        assert int(rec["cost_micro_usd"]) == discounted(full, 0.25) == int(rec["flagship_cost_micro_usd"]) > 0
    [alone] = [r for r in ledger_records(SHARED_URL, prefix) if not r.get("batch_id")]
    assert int(alone["cost_micro_usd"]) == tokens["one"] * PER_TOKEN  # the same input, interactive: full price
    rows = {row.key: row.counters for row in asyncio.run(report_recent(prefix)).rows("endpoint")}
    assert set(rows) == {"embeddings", "batch"} and rows["embeddings"].requests == 1
    assert rows["batch"].requests == 4
    assert rows["batch"].cost_micro_usd == sum(int(r["cost_micro_usd"]) for r in records)
    assert embedder[0].embedding_requests == 5


async def _take_two_then_die(parts: BatchParts) -> None:
    """A worker that died mid-work: two lines taken, never acknowledged, the first answered and kept."""
    answered, _ = await parts.queue.take(await parts.store.open_ids(), "dead", 2)
    batch = await parts.store.batch(answered.batch_id)
    assert batch is not None
    outcome = await parts.runner.run(batch, answered.line)
    assert outcome.ok
    kept, _ = await parts.store.answer(batch.id, answered.line.index, outcome.line, outcome.ok, outcome.tokens)
    assert kept
    parts.worker.start()


def test_an_embedding_line_a_dead_worker_answered_is_answered_again_kept_once_and_billed_once(
        make_gateway: GatewayFactory, tmp_path: Path, fake_upstreams: Upstreams, embedder: tuple[FakeUpstream, str],
        prefix: str) -> None:
    policy = _policy(tmp_path, fake_upstreams, embedder[1], "batches: {claim_after_s: 1}\n")
    gateway = make_gateway(policy, ledger="redis", redis_prefix=prefix)
    parts = _parts(gateway)
    on_loop(gateway, parts.worker.aclose())
    body = {"input_file_id": upload(gateway, jsonl([embed_line(f"line-{i}", f"text {i}") for i in range(4)]))
            .json()["id"], "endpoint": "/v1/embeddings", "completion_window": "24h"}
    batch = gateway.client.post("/v1/batches", headers=A, json=body).json()
    on_loop(gateway, _take_two_then_die(parts))
    done = finished(gateway, batch["id"])
    assert done["request_counts"] == {"total": 4, "completed": 4, "failed": 0}
    assert Counter(o["custom_id"] for o in _file(gateway, done["output_file_id"])) == Counter(
        f"line-{i}" for i in range(4))
    records = _batch_records(prefix, done["id"], 4)
    assert embedder[0].embedding_requests == 5  # the first line sent twice ...
    assert Counter(r["custom_id"] for r in records) == Counter(f"line-{i}" for i in range(4))  # ... billed once
    duplicate = gateway.runtime.metrics.registry.get_sample_value("cascade_batch_lines_total", {"status": "duplicate"})
    assert duplicate == 1


def test_embedding_lines_wait_for_the_embedding_pools_headroom(
        make_gateway: GatewayFactory, tmp_path: Path, fake_upstreams: Upstreams, embedder: tuple[FakeUpstream, str],
        prefix: str) -> None:
    engine = embedder[0]
    engine.waiting = 3.0  # interactive requests queue on the embedding engine (as its /metrics says)
    policy = _policy(tmp_path, fake_upstreams, embedder[1], "batches: {max_queue: 0, max_wait_s: 0.2}\n")
    gateway = make_gateway(policy, ledger="redis", redis_prefix=prefix, probe_interval_s=0.1)
    body = {"input_file_id": upload(gateway, jsonl([embed_line("a", "x"), embed_line("b", "y")])).json()["id"],
            "endpoint": "/v1/embeddings", "completion_window": "24h"}
    batch = gateway.client.post("/v1/batches", headers=A, json=body).json()

    def requeued() -> float:
        value = gateway.runtime.metrics.registry.get_sample_value("cascade_batch_lines_total", {"status": "requeued"})
        return value or 0.0

    until(lambda: requeued() >= 2, 10, lambda: "no line went back to the queue")
    assert engine.embedding_requests == 0  # nothing sent while the engine queues
    engine.waiting = 0.0
    done = finished(gateway, batch["id"])
    assert done["request_counts"]["completed"] == 2 and engine.embedding_requests == 2
    assert 'cascade_batch_lane_in_flight{pool="embed"} 0.0' in gateway.client.get("/metrics").text


def test_a_tenant_no_embedding_pool_serves_gets_the_interactive_error_on_each_line(
        make_gateway: GatewayFactory, tmp_path: Path, fake_upstreams: Upstreams, embedder: tuple[FakeUpstream, str],
        prefix: str) -> None:
    without = make_gateway(batch_policy(tmp_path, fake_upstreams), ledger="redis", redis_prefix=prefix)
    lines = [embed_line("auto", "x", model="auto"), embed_line("named", "x"), embed_line("empty", ""),
             embed_line("generative", "x", model="micro")]
    done = _run(without, lines)
    assert done["status"] == "completed" and done["request_counts"] == {"total": 4, "completed": 0, "failed": 4}
    assert done["output_file_id"] is None
    errors = _file(without, done["error_file_id"])
    assert [e["custom_id"] for e in errors] == [line["custom_id"] for line in lines]
    for line, error in zip(lines, errors, strict=True):  # OpenAI's error-file line, the interactive answer inside
        assert set(error) == {"id", "custom_id", "response", "error"} and error["error"] is None
        assert error["id"].startswith("batch_req_") and set(error["response"]) == {"status_code", "request_id", "body"}
        interactive = without.client.post("/v1/embeddings", headers=A, json=line["body"])
        assert (error["response"]["status_code"], error["response"]["body"]) == (interactive.status_code,
                                                                                 interactive.json())
    assert [e["response"]["status_code"] for e in errors] == [404, 404, 400, 404]
    assert {e["response"]["body"]["error"]["param"] for e in errors} == {"model", "input"}
    # an embedding pool the tenant's allowed_pools leave out: 403 named, 404 for auto, as interactively (the first
    # gateway's worker stopped: the second's lines are answered under the second's policy)
    on_loop(without, _parts(without).worker.aclose())
    limited = make_gateway(_policy(tmp_path, fake_upstreams, embedder[1], "", "embedding.yaml"), ledger="redis",
                           redis_prefix=prefix)
    done = _run(limited, [embed_line("named", "x"), embed_line("auto", "x", model="auto")], C)
    assert [(e["custom_id"], e["response"]["status_code"]) for e in _file(limited, done["error_file_id"], C)] == [
        ("named", 403), ("auto", 404)]
    assert embedder[0].embedding_requests == 0
    assert not [r for r in ledger_records(SHARED_URL, prefix) if r.get("batch_id")]
