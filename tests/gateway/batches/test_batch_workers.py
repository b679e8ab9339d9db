"""Every batch line answered and billed exactly once: across two gateways sharing the queue, a line a dead worker
took (reclaimed, answered again, its first answer kept and its request billed once) and a gateway restarted mid-batch
(the next one finishes it). Real Redis; fake engines in-process."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.batches.objects import Batch, new_batch_id
from gateway.batches.running import BatchParts
from gateway.settings import Settings
from loadtest.fake_upstream import FakeUpstream
from loadtest.scenarios.chaos_figures import ledger_records
from tests.conftest import GATEWAY_DEFAULTS, SHARED_URL, GatewayFactory, Upstreams
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
from tests.harness import FakeEngines, Gateway, InProcessGateway
from tests.servers import until

pytestmark = pytest.mark.redis
LANE = "batches: {{claim_after_s: {claim}, lines_in_flight: 3, folder: '{folder}'}}\n"


@pytest.fixture
def slow_upstreams(fake_engines: FakeEngines) -> Upstreams:
    """The two fake engines, 40 ms an answer: lines stay in flight long enough to be shared and interrupted."""
    micro, flagship = FakeUpstream("micro-model", delay_ms=40), FakeUpstream("flagship-model", delay_ms=40)
    return micro, fake_engines.add("micro", micro), flagship, fake_engines.add("flagship", flagship)


def _policy(tmp_path: Path, upstreams: Upstreams, claim_after_s: int = 1) -> Path:
    """Gateways sharing a prefix share one batch folder (an absolute `batches.folder`), each its own home."""
    return batch_policy(tmp_path, upstreams, LANE.format(claim=claim_after_s, folder=tmp_path / "batch-files"))


def _parts(gateway: Gateway) -> BatchParts:
    parts = gateway.runtime.batches
    assert parts is not None
    return parts


def _batch_records(prefix: str, batch_id: str) -> list[dict[str, str]]:
    return [f for f in ledger_records(SHARED_URL, prefix) if f.get("batch_id") == batch_id]


def _outputs(gateway: Gateway, batch: dict[str, Any]) -> list[dict[str, Any]]:
    content = gateway.client.get(f"/v1/files/{batch['output_file_id']}/content", headers=A).content
    return [orjson.loads(line) for line in content.splitlines()]


def _answered_once_and_billed_once(gateway: Gateway, prefix: str, batch: dict[str, Any], n: int) -> None:
    assert batch["status"] == "completed" and batch["request_counts"] == {"total": n, "completed": n, "failed": 0}
    ids = Counter(o["custom_id"] for o in _outputs(gateway, batch))
    assert ids == Counter({f"line-{i}": 1 for i in range(n)})
    until(lambda: len(_batch_records(prefix, batch["id"])) >= n, 10, lambda: "ledger records missing")
    records = _batch_records(prefix, batch["id"])
    assert Counter(r["custom_id"] for r in records) == ids  # one record a line, each with its custom_id
    assert len({r["request_id"] for r in records}) == n


def _lines(n: int) -> bytes:
    return jsonl([chat_line(f"line-{i}", content=f"question {i}") for i in range(n)])


def _in_lane(gateway: Gateway) -> float:
    value = gateway.runtime.metrics.registry.get_sample_value("cascade_batch_lane_in_flight", {"pool": "micro"})
    return value or 0.0


def _handled(gateway: Gateway) -> float:
    value = gateway.runtime.metrics.registry.get_sample_value("cascade_batch_lines_total", {"status": "completed"})
    return value or 0.0


def test_two_gateways_share_a_batch_and_answer_each_line_once(make_gateway: GatewayFactory, tmp_path: Path,
                                                              slow_upstreams: Upstreams, prefix: str) -> None:
    policy = _policy(tmp_path, slow_upstreams)
    one = make_gateway(policy, ledger="redis", redis_prefix=prefix)
    two = make_gateway(policy, ledger="redis", redis_prefix=prefix)
    batch = create(one, upload(one, _lines(30)).json()["id"]).json()
    done = finished(two, batch["id"], timeout_s=90)
    _answered_once_and_billed_once(one, prefix, done, 30)
    assert _handled(one) > 0 and _handled(two) > 0 and _handled(one) + _handled(two) == 30


async def _take_two_then_die(parts: BatchParts) -> None:
    """What a worker that died mid-work leaves behind: two lines taken by consumer "dead", never acknowledged, the
    first answered (billed, its answer kept), the second not (the batch cannot finish until it is reclaimed)."""
    ids = await parts.store.open_ids()
    answered, _ = await parts.queue.take(ids, "dead", 2)
    batch = await parts.store.batch(answered.batch_id)
    assert batch is not None
    outcome = await parts.runner.run(batch, answered.line)
    kept, _ = await parts.store.answer(batch.id, answered.line.index, outcome.line, outcome.ok)
    assert kept
    parts.worker.start()


def test_a_line_a_dead_worker_took_is_reclaimed_answered_once_and_billed_once(
        make_gateway: GatewayFactory, tmp_path: Path, slow_upstreams: Upstreams, prefix: str) -> None:
    gateway = make_gateway(_policy(tmp_path, slow_upstreams), ledger="redis", redis_prefix=prefix)
    parts = _parts(gateway)
    on_loop(gateway, parts.worker.aclose())
    batch = create(gateway, upload(gateway, _lines(5)).json()["id"]).json()
    micro = slow_upstreams[0]
    on_loop(gateway, _take_two_then_die(parts))
    done = finished(gateway, batch["id"], timeout_s=60)
    _answered_once_and_billed_once(gateway, prefix, done, 5)
    duplicate = gateway.runtime.metrics.registry.get_sample_value("cascade_batch_lines_total",
                                                                  {"status": "duplicate"})
    assert duplicate == 1  # reclaimed and answered again: its first answer stayed, its request billed once
    assert micro.requests == 6


def test_a_gateway_restarted_mid_batch_leaves_the_next_one_to_finish_it(
        make_gateway: GatewayFactory, tmp_path: Path, slow_upstreams: Upstreams, fake_engines: FakeEngines,
        prefix: str) -> None:
    policy = _policy(tmp_path, slow_upstreams, claim_after_s=300)  # nothing waits on a reclaim here
    settings = Settings(**{"policy_path": policy, "home": tmp_path / "first", **GATEWAY_DEFAULTS, "ledger": "redis",
                           "redis_prefix": prefix})
    with InProcessGateway(settings, fake_engines) as first:
        batch = create(first, upload(first, _lines(20)).json()["id"]).json()
        until(lambda: _handled(first) >= 3 and _in_lane(first) > 0, 60, lambda: "no line answered, or none in flight")
    # stopped mid-batch: its lines in flight were cancelled and put back on the queue
    second = make_gateway(policy, ledger="redis", redis_prefix=prefix)  # the same Redis prefix and batch folder
    done = finished(second, batch["id"], timeout_s=90)
    assert 0 < _handled(second) < 20
    _answered_once_and_billed_once(second, prefix, done, 20)


async def _take_one_and_die(parts: BatchParts) -> None:
    await parts.queue.take(await parts.store.open_ids(), "dead", 1)


def test_a_cancelled_batch_ends_once_a_dead_workers_line_is_taken_over(
        make_gateway: GatewayFactory, tmp_path: Path, slow_upstreams: Upstreams, prefix: str) -> None:
    gateway = make_gateway(_policy(tmp_path, slow_upstreams), ledger="redis", redis_prefix=prefix)
    parts = _parts(gateway)
    on_loop(gateway, parts.worker.aclose())
    batch = create(gateway, upload(gateway, _lines(3)).json()["id"]).json()
    on_loop(gateway, _take_one_and_die(parts))  # pending with "dead" until reclaimed
    assert gateway.client.post(f"/v1/batches/{batch['id']}/cancel", headers=A).json()["status"] == "cancelling"
    on_loop(gateway, started(parts.worker))
    done = finished(gateway, batch["id"], timeout_s=60)
    assert done["status"] == "cancelled" and done["request_counts"]["completed"] == 0
    assert slow_upstreams[0].requests == 0  # nothing of a cancelled batch was sent


async def _interrupted_validation(parts: BatchParts) -> str:
    """What a gateway that stopped while validating a batch leaves: the batch "validating", never opened."""
    now = int(time.time())
    batch = Batch(new_batch_id(), "a", "/v1/chat/completions", "file-x", "24h", now - 60, now + 86_400)
    await parts.store.put_batch(batch, index=True)
    await parts.store.validating(batch.id, now - 60)
    return batch.id


def test_a_batch_whose_validation_was_interrupted_is_failed_by_a_sweep(
        make_gateway: GatewayFactory, tmp_path: Path, slow_upstreams: Upstreams, prefix: str) -> None:
    gateway = make_gateway(_policy(tmp_path, slow_upstreams), ledger="redis", redis_prefix=prefix)
    batch_id = on_loop(gateway, _interrupted_validation(_parts(gateway)))
    done = finished(gateway, batch_id)
    assert done["status"] == "failed" and done["errors"]["data"][0]["code"] == "validation_interrupted"


async def _take(parts: BatchParts, count: int, order: list[str]) -> list[str]:
    return [t.batch_id for t in await parts.queue.take(order, "probe", count)]


def test_a_take_gets_at_most_count_lines_over_every_batch_in_the_order_given(
        make_gateway: GatewayFactory, tmp_path: Path, slow_upstreams: Upstreams, prefix: str) -> None:
    gateway = make_gateway(_policy(tmp_path, slow_upstreams), ledger="redis", redis_prefix=prefix)
    parts = _parts(gateway)
    on_loop(gateway, parts.worker.aclose())
    first, second = (create(gateway, upload(gateway, _lines(3)).json()["id"]).json()["id"] for _ in range(2))
    assert on_loop(gateway, _take(parts, 2, [second, first])) == [second, second]
    assert on_loop(gateway, _take(parts, 3, [second, first])) == [second, first, first]
    assert on_loop(gateway, _take(parts, 5, [first, second])) == [first]  # the rest: taken above
