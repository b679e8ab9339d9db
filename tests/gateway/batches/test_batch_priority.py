"""Batch lines behind interactive requests on the engine: where a local pool's engine schedules by priority
(`--scheduling-policy priority`), a batch line's body carries the policy's `batches.engine_priority` and an
interactive request's none (a client's own is dropped there); a remote pool, an engine without the flag, or a
version the policy does not name never gets one (over fake engines, in-process, the real Redis)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from backends.engines.registry import REGISTRY_ENV, publish
from gateway.serving.openai.upstream import engine_body
from loadtest.fake_upstream import FakeUpstream
from policies.batches import priority_scheduled
from policies.decide import RouteDecision
from policies.loader import PolicyError, load_policy
from policies.pools import engine_version
from policies.schema import LocalPool, Policy
from tests.conftest import GatewayFactory, Upstreams
from tests.gateway.batches.test_batch_api import TENANTS, A, chat_line, create, finished, jsonl, upload
from tests.harness import Gateway

PRIORITY_ENGINE = '["--scheduling-policy", "priority"]'


def _policy(tmp_path: Path, flagship_url: str, extra_args: str = PRIORITY_ENGINE,
            batches: str = "batches: {engine_priority: 7}\n") -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(f"""version: 1
pools:
  micro:
    type: local
    price: {{input_per_mtok: "0.20", output_per_mtok: "0.20"}}
    engine: {{model: demo:micro, served_name: micro-model, extra_args: {extra_args}}}
  flagship:
    type: remote
    urls: ["{flagship_url}"]
    model: flagship-model
    price: {{input_per_mtok: "3.00", output_per_mtok: "15.00"}}
routing: {{micro_pool: micro, flagship_pool: flagship, threshold: 0.5}}
{TENANTS}{batches}""")
    return path


@pytest.fixture
def micro_local(fake_upstreams: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeUpstream:
    """The micro fake engine as a local pool's replica, published where a `--no-engines` gateway looks."""
    micro, micro_url = fake_upstreams[0], fake_upstreams[1]
    registry = tmp_path / "engines"
    publish(registry, "micro", [micro_url])
    monkeypatch.setenv(REGISTRY_ENV, str(registry))
    return micro


def _run_line(gateway: Gateway, line: dict[str, Any]) -> dict[str, Any]:
    done = finished(gateway, create(gateway, upload(gateway, jsonl([line])).json()["id"]).json()["id"])
    assert done["request_counts"]["completed"] == 1, done
    return dict(done)


@pytest.mark.redis
def test_a_batch_line_carries_the_priority_an_interactive_request_does_not(
        make_gateway: GatewayFactory, tmp_path: Path, fake_upstreams: Upstreams, micro_local: FakeUpstream,
        prefix: str) -> None:
    flagship = fake_upstreams[2]
    gateway = make_gateway(_policy(tmp_path, fake_upstreams[3]), ledger="redis", redis_prefix=prefix)
    _run_line(gateway, chat_line("low", priority=-5))  # a line's own priority is the gateway's to set
    assert micro_local.last_body is not None and micro_local.last_body["priority"] == 7
    own: list[dict[str, Any]] = [{}, {"priority": -5}]
    for body in own:
        r = gateway.client.post("/v1/chat/completions", headers=A, json=chat_line("x", **body)["body"])
        assert r.status_code == 200 and r.headers["x-cascade-pool"] == "micro", r.text
        assert "priority" not in micro_local.last_body  # the engine's 0: served before any waiting line
    _run_line(gateway, chat_line("remote", model="flagship"))
    assert flagship.last_body is not None and "priority" not in flagship.last_body
    r = gateway.client.post("/v1/chat/completions", headers=A,
                            json=chat_line("x", model="flagship", priority=3)["body"])
    assert r.status_code == 200 and flagship.last_body["priority"] == 3  # a remote engine's own business


@pytest.mark.redis
@pytest.mark.parametrize(("extra_args", "batches"), [("[]", ""), (PRIORITY_ENGINE, "")])
def test_no_priority_without_both_the_engine_flag_and_the_policy(
        make_gateway: GatewayFactory, tmp_path: Path, fake_upstreams: Upstreams, micro_local: FakeUpstream,
        prefix: str, extra_args: str, batches: str) -> None:
    gateway = make_gateway(_policy(tmp_path, fake_upstreams[3], extra_args, batches), ledger="redis",
                           redis_prefix=prefix)
    _run_line(gateway, chat_line("plain"))
    assert micro_local.last_body is not None and "priority" not in micro_local.last_body


def _loaded(tmp_path: Path, extra_args: str = PRIORITY_ENGINE, canary: str = "",
            batches: str = "batches: {engine_priority: 7}\n") -> Policy:
    path = _policy(tmp_path, "http://127.0.0.1:9", batches=batches)
    path.write_text(path.read_text().replace(f"extra_args: {PRIORITY_ENGINE}}}", f"extra_args: {extra_args}}}{canary}"))
    return load_policy(path).policy


def _decision(version: str) -> RouteDecision:
    return RouteDecision("micro", "micro-model", None, "", "pinned", "p1", pool_version=version)


def test_only_the_version_started_with_priority_scheduling_is_sent_a_priority(tmp_path: Path) -> None:
    canary = ("\n    canary: {weight: 0.5, engine: {model: demo:micro, served_name: micro-model, base_port: 8200, "
              "extra_args: []}}")
    policy = _loaded(tmp_path, canary=canary)
    micro = policy.pools["micro"]
    assert isinstance(micro, LocalPool) and micro.canary is not None
    own, other = engine_version(micro.engine), engine_version(micro.canary.engine)
    assert priority_scheduled(micro, own) and not priority_scheduled(micro, other)
    assert not priority_scheduled(micro, "") and not priority_scheduled(policy.pools["flagship"], own)
    line = {"model": "micro-model", "priority": -1}
    on_own = _decision(own)
    assert engine_body(line, policy, on_own, batch_line=True) == {"model": "micro-model", "priority": 7}
    assert engine_body(line, policy, on_own, batch_line=False) == {"model": "micro-model"}
    on_canary = _decision(other)
    assert engine_body(line, policy, on_canary, batch_line=True) is line  # its engine would refuse a priority
    assert line == {"model": "micro-model", "priority": -1}  # the body given is never changed


def test_the_flag_is_read_in_either_spelling(tmp_path: Path) -> None:
    micro = _loaded(tmp_path, '["--scheduling-policy=priority"]').pools["micro"]
    assert isinstance(micro, LocalPool) and priority_scheduled(micro, engine_version(micro.engine))
    fcfs = _loaded(tmp_path, '["--scheduling-policy", "fcfs"]', batches="").pools["micro"]
    assert isinstance(fcfs, LocalPool) and not priority_scheduled(fcfs, engine_version(fcfs.engine))


@pytest.mark.parametrize(("extra_args", "batches", "problem"), [
    (PRIORITY_ENGINE, "batches: {engine_priority: 0}\n", "greater than or equal to 1"),
    (PRIORITY_ENGINE, "batches: {engine_priority: -3}\n", "greater than or equal to 1"),
    ("[]", "batches: {engine_priority: 7}\n", "no pool's engine schedules by priority"),
])
def test_engine_priority_is_refused_where_it_would_put_lines_first_or_change_nothing(
        tmp_path: Path, extra_args: str, batches: str, problem: str) -> None:
    with pytest.raises(PolicyError) as caught:
        load_policy(_policy(tmp_path, "http://127.0.0.1:9", extra_args, batches))
    assert problem in str(caught.value) and "engine_priority" in str(caught.value)

