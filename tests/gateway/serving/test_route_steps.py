"""The gateway's own route steps, each appending its entry to the decision's route: the budget downgrade (the
router) and the canary split (`PoolVersions`). The others are asserted where their behaviour is tested: context-fit
(test_context_fit), json-guard (checking/test_json_fallback), failover (api/test_app), cascade and cascade-held
(test_cascade, test_cascade_held_http), output-check (test_output_checks_http), cache (caching/test_cache_http),
canary-fallback (control/test_canary), on-demand-fallback and the context step through a gateway
(test_route_http)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from backends.clients.pool import Pool
from gateway.control.fleet.canaries import CanaryRoute
from gateway.ledger.store import MAX_ROUTE, MemoryLedger
from gateway.serving.openai.schema import ChatRequest
from gateway.serving.openai.usage import Usage
from gateway.serving.records.accounting import Accountant, RequestFacts
from gateway.serving.routing.router import RequestRouter
from gateway.serving.routing.versions import PoolVersions
from gateway.telemetry.metrics import GatewayMetrics
from policies.decide import RouteDecision, RouteStep, route_text
from policies.ladder import LadderState
from policies.loader import parse_policy
from tests.conftest import policy_yaml

LOADED = parse_policy(policy_yaml("http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1"))


async def test_a_budget_downgrade_is_a_step_after_the_decision() -> None:
    raw: dict[str, Any] = {"model": "flagship", "messages": [{"role": "user", "content": "a secret plan"}]}
    router = RequestRouter(None, GatewayMetrics(lambda: {}))
    decision = await router.route(ChatRequest.model_validate(raw), raw, "default", {}, LOADED, LadderState(),
                                  downgrade=True)
    assert (decision.pool, decision.rule) == ("micro", "budget-downgrade")
    assert decision.route[-1] == RouteStep("budget-downgrade", "micro", "the tenant is over budget (policy: "
                                                                        "downgrade)")
    assert route_text(decision.route) == "pinned:flagship, budget-downgrade:micro"


def test_a_canary_that_takes_the_request_is_a_step_and_the_pools_own_version_is_none() -> None:
    own, canary = Pool("micro", ["http://own"], None), Pool("micro", ["http://canary"], None)  # type: ignore[arg-type]
    canary.replicas[0].healthy = True
    routed = RouteDecision("micro", "micro-model", 0.1, "threshold", "scored", "v", route=(
        RouteStep("score", "micro", "low"),))
    always = PoolVersions({"micro": own}, {"micro": CanaryRoute(canary, "v2", "micro-v2", 1.0, None)})
    decision, pool = always.target(routed, {})
    assert pool is canary and (decision.model, decision.pool_version) == ("micro-v2", "v2")
    assert decision.route[-1] == RouteStep("canary", "micro", "version v2 takes 100% of the pool's requests")
    never = PoolVersions({"micro": own}, {"micro": CanaryRoute(canary, "v2", "micro-v2", 0.0, None)})
    decision, pool = never.target(routed, {})
    assert pool is own and decision.route == routed.route  # the pool's own version: nothing chose anything new


async def test_the_cost_record_keeps_the_route_and_cuts_one_too_long_for_it() -> None:
    ledger = MemoryLedger()
    route = tuple(RouteStep(f"rule:rule-{i}", "micro", "matched") for i in range(200))  # ~4,000 characters
    decision = RouteDecision("micro", "micro-model", 0.1, "rule-199", "r", "v", route=route)
    facts = RequestFacts("req_long", "default", decision, time.time(), time.monotonic(), None, "ok")
    rec = await Accountant(ledger).record(LOADED.policy, facts, Usage(3, 4))
    assert ledger.records["req_long"] is rec  # validated and kept: a route never costs a record
    assert len(rec.route) == MAX_ROUTE and rec.route.startswith("rule:rule-0:micro, rule:rule-1:micro")
    short = RequestFacts("req_short", "default", replace(decision, route=route[:2]), time.time(), time.monotonic(),
                         None, "ok")
    assert (await Accountant(ledger).record(LOADED.policy, short, Usage(3, 4))).route == (
        "rule:rule-0:micro, rule:rule-1:micro")
