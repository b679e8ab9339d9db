"""Where an unsure cascade answer may go: the tenant's pools, the budget downgrade, the ladder's threshold,
pool moves and shedding, in that order."""

from __future__ import annotations

from pathlib import Path

from policies.escalation import Escalation, escalation
from policies.ladder import Ladder, LadderState
from policies.loader import parse_policy
from policies.schema import LadderStep

ROOT = Path(__file__).resolve().parents[2]
CLOUD = """  cloud:
    type: remote
    urls: ["http://127.0.0.1:9"]
    model: cloud-model
    price: {input_per_mtok: "5.00", output_per_mtok: "20.00"}
"""
TENANTS = """tenants:
  narrow: {allowed_pools: [micro]}
  no-cloud: {allowed_pools: [micro, flagship]}
  gold: {priority: 5}
"""
POLICY = parse_policy((ROOT / "policies" / "default.yaml").read_text().replace("pools:\n", "pools:\n" + CLOUD, 1)
                      + TENANTS).policy


def _ladder(*actions: dict[str, object]) -> LadderState:
    steps = [LadderStep.model_validate({"name": f"s{i}", "signal": "queue_depth", "pool": "flagship",
                                        "enter_above": 10, "exit_below": 1, "action": a})
             for i, a in enumerate(actions)]
    return Ladder(steps).update({("queue_depth", "flagship"): 20}, now=0)


def test_escalates_to_the_flagship_when_nothing_stands_in_the_way() -> None:
    assert escalation(POLICY, "anyone", LadderState(), False).pool == "flagship"


def test_tenant_pools_and_budget_keep_the_micro_answer() -> None:
    assert escalation(POLICY, "narrow", LadderState(), False).held == "tenant-pools"
    budget = escalation(POLICY, "anyone", LadderState(), True)
    assert (budget.pool, budget.held) == (None, "budget")


def test_ladder_threshold_and_moves() -> None:
    raised = _ladder({"type": "raise_threshold", "threshold": 0.9})
    assert escalation(POLICY, "anyone", raised, False).held == "ladder:s0"
    to_micro = escalation(POLICY, "anyone", _ladder({"type": "fallback_pool", "to_pool": "micro"}), False)
    assert (to_micro.pool, to_micro.held) == (None, "ladder:s0")
    burst = _ladder({"type": "overflow", "to_pool": "cloud"})
    assert escalation(POLICY, "anyone", burst, False).pool == "cloud"
    assert escalation(POLICY, "no-cloud", burst, False).pool == "flagship"  # a move the tenant may not take


def test_a_shed_step_on_the_target_holds_low_priority_tenants_only() -> None:
    shed = _ladder({"type": "shed", "below_priority": 1})
    assert escalation(POLICY, "anyone", shed, False) == Escalation(None, "shed",
                                                                   "the ladder sheds tenant 'anyone' on 'flagship'")
    assert escalation(POLICY, "gold", shed, False).pool == "flagship"
