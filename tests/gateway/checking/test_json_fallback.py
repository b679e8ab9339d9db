"""The ladder's fallback_pool.max_json_failure_rate: JSON traffic stays off a fallback pool that breaks JSON."""

from __future__ import annotations

from gateway.checking.fallback import json_fallback_refused
from gateway.checking.judge import JsonRates
from policies.checks import reference_problems
from policies.decide import RouteDecision, RouteStep
from policies.ladder import Ladder, LadderState
from policies.output_checks import OutputChecks
from policies.schema import Policy

_PRICE = {"input_per_mtok": "1", "output_per_mtok": "1"}
STEP = {"name": "kv-high", "signal": "kv_cache_usage", "pool": "flagship", "enter_above": 0.85,
        "exit_below": 0.7, "action": {"type": "fallback_pool", "to_pool": "int8", "max_json_failure_rate": 0.2,
                                      "json_window": 10}}
POLICY = Policy.model_validate({
    "pools": {name: {"type": "remote", "urls": ["http://x"], "model": f"{name}-model", "price": _PRICE}
              for name in ("micro", "flagship", "int8")},
    "routing": {"micro_pool": "micro", "flagship_pool": "flagship"},
    "degradation": {"steps": [STEP]},
})
MOVED = RouteDecision("int8", "int8-model", 0.9, "ladder:kv-high", "moved by kv-high", "1")
JSON = {"response_format": {"type": "json_object"}}


def _active() -> LadderState:
    return Ladder(POLICY.degradation.steps).update({("kv_cache_usage", "flagship"): 0.95}, now=0)


def _rates(failed: int, of: int) -> JsonRates:
    rates = JsonRates()
    for i in range(of):
        rates.observe("int8", i < failed)
    return rates


def test_json_requests_stay_on_their_pool_while_the_fallback_breaks_json() -> None:
    kept = json_fallback_refused(POLICY, MOVED, JSON, _active(), _rates(3, 10))
    assert (kept.pool, kept.model, kept.rule) == ("flagship", "flagship-model", "json-guard:kv-high")
    assert "30% of its last 10 JSON answers" in kept.reason
    assert kept.route == (RouteStep("json-guard:kv-high", "flagship", "'int8' failed the json check on 30% of its last "
                                    "10 JSON answers (bound 20%)"),)


def test_the_move_stands_below_the_bound_without_json_or_with_too_few_answers() -> None:
    ladder = _active()
    assert json_fallback_refused(POLICY, MOVED, JSON, ladder, _rates(2, 10)) is MOVED  # 20%: not above
    assert json_fallback_refused(POLICY, MOVED, {}, ladder, _rates(10, 10)) is MOVED  # not a JSON request
    assert json_fallback_refused(POLICY, MOVED, JSON, ladder, _rates(5, 9)) is MOVED  # window not filled yet
    routed = RouteDecision("flagship", "flagship-model", 0.9, "threshold", "", "1")
    assert json_fallback_refused(POLICY, routed, JSON, ladder, _rates(10, 10)) is routed


def test_the_window_is_the_last_answers() -> None:
    rates = _rates(10, 10)
    for _ in range(10):
        rates.observe("int8", False)
    assert json_fallback_refused(POLICY, MOVED, JSON, _active(), rates) is MOVED




def test_a_bound_with_no_json_check_to_measure_it_is_refused_at_load() -> None:
    (problem,) = reference_problems(POLICY)
    assert problem[0] == ("degradation", "steps", 0, "action", "max_json_failure_rate")
    assert "turn the json output check on" in problem[1]
    checked = POLICY.model_copy(update={"output_checks": OutputChecks.model_validate({"json": "flag"})})
    assert reference_problems(checked) == []
