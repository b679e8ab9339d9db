"""One tenant decision for every move the gateway makes after routing (failover, on-demand fallback, cascade)."""

from __future__ import annotations

from policies.ladder import ActiveStep, LadderState
from policies.ladder_schema import Shed
from policies.loader import parse_policy
from policies.tenant_moves import move_refused

POLICY = parse_policy("""
version: 1
pools:
  micro: {type: remote, urls: ["http://127.0.0.1:1"], model: m, price: {input_per_mtok: "0.2", output_per_mtok: "0.2"}}
  flagship: {type: remote, urls: ["http://127.0.0.1:2"], model: f, price: {input_per_mtok: "3", output_per_mtok: "15"}}
routing: {micro_pool: micro, flagship_pool: flagship}
tenants:
  small: {api_key_sha256: ['0000000000000000000000000000000000000000000000000000000000000000'],
          allowed_pools: [micro]}
  low: {api_key_sha256: ['1111111111111111111111111111111111111111111111111111111111111111'], priority: 0}
""", source="test").policy


def test_each_rule_refuses_its_move() -> None:
    calm = LadderState()
    assert move_refused(POLICY, "small", "flagship", calm, False).code == "tenant-pools"  # type: ignore[union-attr]
    assert move_refused(POLICY, "small", "micro", calm, False) is None
    assert move_refused(POLICY, "low", "flagship", calm, True).code == "budget"  # type: ignore[union-attr]
    assert move_refused(POLICY, "low", "micro", calm, True) is None  # over budget: the cheap pool stays open
    assert move_refused(POLICY, "low", "flagship", calm, False) is None
    step = ActiveStep("flagship-busy", Shed(type="shed", below_priority=1), 0.0, pool="flagship")
    shedding = LadderState.combine([step])
    assert move_refused(POLICY, "low", "flagship", shedding, False).code == "shed"  # type: ignore[union-attr]
    assert move_refused(POLICY, "low", "micro", shedding, False) is None  # the step sheds on the flagship only
