"""Preemption (`batches.preempt`): a batch line running on its pool when an interactive request arrives there past
the lane's bounds is cancelled (its engine request closed), put back on the queue, and answered and billed once later.
Real Redis; fake engines in-process."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtest.fake_upstream import FakeUpstream
from tests.conftest import GatewayFactory, Upstreams
from tests.gateway.batches.test_batch_api import A, batch_policy, chat_line, create, finished, upload
from tests.gateway.batches.test_batch_workers import _answered_once_and_billed_once, _in_lane, _lines
from tests.harness import FakeEngines, Gateway
from tests.servers import until

pytestmark = pytest.mark.redis


@pytest.fixture
def slow_engines(fake_engines: FakeEngines) -> Upstreams:
    """200 ms an answer (16 tokens, 12.5 ms each): a line is still running when the interactive request comes."""
    micro, flagship = FakeUpstream("micro-model", delay_ms=12.5), FakeUpstream("flagship-model", delay_ms=12.5)
    return micro, fake_engines.add("micro", micro), flagship, fake_engines.add("flagship", flagship)


def _preempted(gateway: Gateway) -> float:
    registry = gateway.runtime.metrics.registry
    return registry.get_sample_value("cascade_batch_lines_preempted_total", {"pool": "micro"}) or 0.0


@pytest.mark.parametrize("preempt", [True, False])
def test_a_running_line_is_preempted_by_an_interactive_request_and_answered_once_later(
        make_gateway: GatewayFactory, tmp_path: Path, slow_engines: Upstreams, prefix: str, preempt: bool) -> None:
    lane = f"batches: {{max_interactive: 0, lines_in_flight: 1, preempt: {str(preempt).lower()}}}\n"
    gateway = make_gateway(batch_policy(tmp_path, slow_engines, lane), ledger="redis", redis_prefix=prefix)
    micro = slow_engines[0]
    batch = create(gateway, upload(gateway, _lines(1)).json()["id"]).json()
    until(lambda: micro.requests == 1 and _in_lane(gateway) == 1, 30, lambda: "the line never reached its engine")
    r = gateway.client.post("/v1/chat/completions", headers=A, json=chat_line("x")["body"])
    assert r.status_code == 200 and r.headers["x-cascade-pool"] == "micro", r.text
    done = finished(gateway, batch["id"], timeout_s=60)
    _answered_once_and_billed_once(gateway, prefix, done, 1)  # one output line, one ledger record
    if preempt:  # closed on its engine, then sent again once the interactive request was answered
        assert (_preempted(gateway), micro.aborted, micro.requests) == (1, 1, 3)
    else:  # ran to its end beside the interactive request
        assert (_preempted(gateway), micro.aborted, micro.requests) == (0, 0, 2)
