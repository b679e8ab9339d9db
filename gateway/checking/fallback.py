"""Keep JSON traffic off a fallback pool that breaks JSON: the ladder's `fallback_pool.max_json_failure_rate`.

A quantized fallback is a known source of broken JSON. When a `fallback_pool` step moved a request that asks for
JSON (`response_format` json_object / json_schema) to its `to_pool`, and that pool's share of answers failing the
json output check, over the step's `json_window` last checked JSON answers, is above the step's bound, the request
goes back to the pool the step moved it from (rule "json-guard:<step>"). With fewer checked answers than the
window the rate is not trusted yet and the move stands.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.checking.judge import JsonRates
from gateway.checking.schemas import response_schema
from policies.decide import RouteDecision, moved
from policies.ladder import LadderState
from policies.schema import FallbackPool, Policy

__all__ = ["json_fallback_refused"]


def json_fallback_refused(policy: Policy, decision: RouteDecision, raw: Mapping[str, Any], ladder: LadderState,
                          rates: JsonRates) -> RouteDecision:
    """`decision`, or the decision moved back to the step's `from_pool` (see the module docstring)."""
    if not decision.rule.startswith("ladder:") or response_schema(raw) is None:
        return decision
    name = decision.rule.removeprefix("ladder:")
    step = next((s for s in policy.degradation.steps if s.name == name), None)
    if step is None or not isinstance(step.action, FallbackPool) or step.action.max_json_failure_rate is None:
        return decision
    origin, target = step.remap or (step.pool, step.action.to_pool)
    if target != decision.pool or name not in ladder.names:
        return decision
    rate, seen = rates.rate(target, step.action.json_window)
    if seen < step.action.json_window or rate <= step.action.max_json_failure_rate:
        return decision
    why = (f"{target!r} failed the json check on {rate:.0%} of its last {seen} JSON answers "
           f"(bound {step.action.max_json_failure_rate:.0%})")
    return moved(policy, decision, f"json-guard:{name}", origin, why, f"{why}: kept on {origin!r}")
