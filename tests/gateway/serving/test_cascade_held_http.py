"""The cascade keeps an unsure micro answer when the pool it would escalate to cannot take the request: no ready
replica, or an on-demand pool that is asleep (its cold start begins, but the answer does not wait for it). The
gateway in-process (`tests.harness`) over fake engines on ports whose logprobs we control; the on-demand pool is a
real local pool of the gateway's own supervisor."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from gateway.settings import Settings
from tests.conftest import Upstreams, policy_yaml
from tests.gateway.serving.test_cascade import CASCADE, _assert_held, _unsure
from tests.harness import Gateway, InProcessGateway
from tests.servers import free_port

ON_DEMAND_FLAGSHIP = """  big:
    type: local
    price: {{gpu_hour_usd: "2.00", tokens_per_second: 100}}
    engine: {{model: /nonexistent/flagship-weights, served_name: big, base_port: {port}, startup_timeout_s: 60}}
    on_demand: {{idle_stop_after_s: 600, cold_start_timeout_s: {timeout}{fallback}}}
"""


@contextmanager
def _gateway(tmp_path: Path, micro_url: str, flagship_url: str, pools: str = "", flagship: str = "flagship",
             **settings: Any) -> Iterator[Gateway]:
    policy = policy_yaml(micro_url, flagship_url, CASCADE).replace("pools:\n", "pools:\n" + pools, 1)
    path = tmp_path / "policy.yaml"
    path.write_text(policy.replace("flagship_pool: flagship", f"flagship_pool: {flagship}"))
    with InProcessGateway(Settings(policy_path=path, scorer="length", home=tmp_path, ledger="memory",
                                   probe_interval_s=0.1, **{"start_engines": False, **settings})) as gateway:
        yield gateway


def _held_once(gateway: Gateway, stream: bool, why: str) -> None:
    resp = _unsure(gateway, stream)
    _assert_held(resp, why)
    if stream:
        assert resp.text.count("\"content\":\" w") == 8  # the held-back probe tokens and the rest, in full
    (rec,) = gateway.records(1).values()  # one call, charged once at micro prices, not as a probe
    assert (rec.pool, rec.status, rec.rule, rec.completion_tokens) == ("micro", "ok", "cascade-held", 8)
    assert rec.request_id == resp.headers["x-request-id"]
    metrics = gateway.client.get("/metrics").text
    assert f'cascade_escalations_total{{held_by="{why}",outcome="held",pool="micro"}} 1.0' in metrics
    assert 'outcome="escalated"' not in metrics


@pytest.mark.parametrize("stream", [False, True])
def test_flagship_without_a_ready_replica_keeps_the_micro_answer(tmp_path: Path, upstreams: Upstreams,
                                                                 stream: bool) -> None:
    micro, micro_url, flagship, _ = upstreams
    with _gateway(tmp_path, micro_url, f"http://127.0.0.1:{free_port()}") as gateway:  # nothing listens
        _held_once(gateway, stream, "no-replica")
    assert flagship.requests == 0 and micro.requests == 1


@pytest.mark.parametrize(("fallback", "stream"), [("", False), ("", True), (", on_cold: \"fallback:micro\"", False)])
def test_an_asleep_on_demand_flagship_keeps_the_micro_answer(tmp_path: Path, upstreams: Upstreams, fallback: str,
                                                            stream: bool) -> None:
    """Without a fallback the cold start outlasts `cold_start_timeout_s` (its engine never gets ready); with
    `on_cold: fallback:micro` the answer is micro's at once. Either way: held by "on-demand", charged once."""
    micro, micro_url, flagship, flagship_url = upstreams
    pools = ON_DEMAND_FLAGSHIP.format(port=free_port(), timeout=0.5, fallback=fallback)
    with _gateway(tmp_path, micro_url, flagship_url, pools, flagship="big", start_engines=True) as gateway:
        _held_once(gateway, stream, "on-demand")
    assert flagship.requests == 0 and micro.requests == 1


@pytest.mark.parametrize("stream", [False, True])
def test_a_flagship_whose_every_replica_answers_5xx_keeps_the_micro_answer(tmp_path: Path, upstreams: Upstreams,
                                                                           stream: bool) -> None:
    """The escalation's failover: the other tier is the micro pool, whose answer is in hand."""
    micro, micro_url, flagship, flagship_url = upstreams
    flagship.fail_status = 500
    with _gateway(tmp_path, micro_url, flagship_url) as gateway:
        _held_once(gateway, stream, "engine-error")
    assert flagship.requests == 1 and micro.requests == 1
