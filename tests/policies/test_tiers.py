"""Many pools on one map: a tiers policy loads (or is refused with the file, line and fix), decides the best trade
of predicted quality against expected cost among the tiers a tenant may use, and moves requests along the tiers
(failover and context fit: next up, then down; the cascade: one up; an over-budget tenant: never up)."""

from __future__ import annotations

import pytest

from policies.context import RouteContext
from policies.decide import RouteDecision, decide
from policies.escalation import escalation
from policies.explain import explain, render_explanation
from policies.ladder import LadderState
from policies.loader import LoadedPolicy, PolicyError, parse_policy
from policies.tenant_moves import move_refused, other_tiers
from policies.tiers import TierEstimate, Trade, choose, neighbours, solve_tradeoff, tier_above

POOLS = """
pools:
  general: {type: remote, urls: ["http://g"], model: g, placement: g.json,
            price: {input_per_mtok: "0.20", output_per_mtok: "0.20"}}
  code: {type: remote, urls: ["http://c"], model: c, placement: c.json, expected_completion_tokens: 400,
         price: {input_per_mtok: "0.80", output_per_mtok: "0.80"}}
  flagship: {type: remote, urls: ["http://f"], model: f, placement: f.json,
             price: {input_per_mtok: "10.00", output_per_mtok: "30.00"}}
"""


def _policy(routing: str = "tiers: [general, code, flagship]", extra: str = "") -> LoadedPolicy:
    return parse_policy(f"version: 1\n{POOLS}routing:\n  {routing}\n{extra}", "three.yaml")


def _problems(routing: str, extra: str = "") -> list[str]:
    with pytest.raises(PolicyError) as caught:
        _policy(routing, extra)
    return caught.value.problems


def _ctx(tenant: str = "anyone", model: str = "auto", text: str = "hello there") -> RouteContext:
    return RouteContext.from_request({"model": model, "messages": [{"role": "user", "content": text}]}, tenant, {})


def _trade(general: float, code: float, flagship: float, tradeoff: float = 0.0) -> Trade:
    return Trade((TierEstimate("general", general, 0.0001), TierEstimate("code", code, 0.0004),
                  TierEstimate("flagship", flagship, 0.008)), tradeoff)


def test_tiers_set_the_micro_and_flagship_pools_to_their_ends() -> None:
    routing = _policy().policy.routing
    assert (routing.micro_pool, routing.flagship_pool, routing.tiers) == ("general", "flagship",
                                                                          ("general", "code", "flagship"))


def test_a_tier_without_a_placement_is_refused_with_its_line_and_the_fix() -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(f"version: 1\n{POOLS.replace(' placement: c.json,', '')}routing:\n  tiers: [general, code, "
                     "flagship]\n", "three.yaml")
    (problem,) = caught.value.problems
    assert problem.startswith("three.yaml:6: pools.code.placement: pool 'code' is a tier and has no placement")
    assert "cascade router place" in problem


def test_a_negative_tradeoff_is_refused() -> None:
    (problem,) = _problems("tiers: [general, code, flagship]\n  tradeoff: -1")
    assert problem.startswith("three.yaml:12: routing.tradeoff:")
    assert "negative" in problem and "use 0 or more" in problem


def test_a_cost_target_below_the_cheapest_tier_is_refused() -> None:
    # general: 256 expected completion tokens at $0.20/Mtok = $0.0512 per 1,000 requests before any prompt token
    (problem,) = _problems("tiers: [general, code, flagship]\n  cost_per_1k: '0.05'")
    assert problem.startswith("three.yaml:12: routing.cost_per_1k: cost_per_1k $0.05 is below what the cheapest "
                              "tier 'general' costs per 1,000 requests ($0.051200")
    _policy("tiers: [general, code, flagship]\n  cost_per_1k: '0.06'")  # just above it loads


@pytest.mark.parametrize(("routing", "where", "says"), [
    ("tiers: [general, coder, flagship]", "routing.tiers[1]", "unknown pool 'coder'"),
    ("tiers: [general, code, general]", "routing.tiers[2]", "listed twice"),
    ("tiers: [general]", "routing.tiers", "at least two pools"),
    ("tiers: [general, flagship]\n  micro_pool: code", "routing.micro_pool", "is not the first tier 'general'"),
    ("micro_pool: general\n  flagship_pool: flagship\n  tradeoff: 10", "routing.tradeoff", "routing.tiers is not set"),
    ("tiers: [general, flagship]\n  tradeoff: 10\n  cost_per_1k: '5'", "routing.cost_per_1k", "not both"),
])
def test_tier_cross_checks_name_the_field(routing: str, where: str, says: str) -> None:
    problems = _problems(routing)
    assert any(f" {where}: " in p and says in p for p in problems), problems


def test_choose_trades_quality_against_cost() -> None:
    trade = _trade(0.6, 0.8, 0.95)
    assert choose(trade.estimates, 0).pool == "flagship"  # 0: the best predicted quality whatever it costs
    assert choose(trade.estimates, 100).pool == "code"  # 0.8 - 0.04 beats 0.95 - 0.8 and 0.6 - 0.01
    assert choose(trade.estimates, 10_000).pool == "general"
    same = (TierEstimate("general", 0.5, 0.0), TierEstimate("code", 0.5, 0.0))
    assert choose(same, 0).pool == "general"  # a tie goes to the cheaper tier


def test_solve_tradeoff_holds_a_mean_cost_per_1k_requests() -> None:
    window = [_trade(0.6, 0.8, 0.95).estimates, _trade(0.2, 0.3, 0.9).estimates, _trade(0.9, 0.9, 0.95).estimates]
    assert solve_tradeoff(window, 100.0) == 0.0  # the best-quality choices ($8 per 1k) are within $100 per 1k
    tradeoff = solve_tradeoff(window, 3.0)
    cost = sum(choose(row, tradeoff).cost_usd for row in window) / len(window) * 1000
    assert cost <= 3.0 and sum(choose(row, tradeoff * 0.99).cost_usd for row in window) / 3 * 1000 > 3.0
    assert [choose(row, tradeoff).pool for row in window] == ["code", "flagship", "general"]


def test_the_trade_decides_an_auto_request() -> None:
    loaded = _policy("tiers: [general, code, flagship]\n  tradeoff: 100")
    trade = _trade(0.6, 0.8, 0.95, 100)
    decision = decide(loaded.policy, loaded.version, _ctx(), 0.4, trade=trade)
    assert (decision.pool, decision.model, decision.rule) == ("code", "c", "trade")
    assert [(s.step, s.pool) for s in decision.route] == [("trade", "code")]
    assert "general=0.600/$0.000100, code=0.800/$0.000400, flagship=0.950/$0.008000" in decision.route[0].why
    assert decision.trade == trade
    without = decide(loaded.policy, loaded.version, _ctx(), 0.4)  # no prediction: split by score between the ends
    assert (without.pool, without.rule, without.trade) == ("general", "threshold", None)


def test_rules_pins_and_tenant_pools_come_before_the_trade() -> None:
    loaded = _policy("tiers: [general, code, flagship]\n  rules:\n    - {name: big, match: {keywords: [proof]}, "
                     "pool: flagship}", "tenants:\n  cheap: {allowed_pools: [general, code]}\n  own: {threshold: 0.9}")
    policy, trade = loaded.policy, _trade(0.6, 0.7, 0.95)
    assert decide(policy, "v", _ctx(text="a proof please"), 0.1, trade=trade).route[0].step == "rule:big"
    assert decide(policy, "v", _ctx(model="g"), None, trade=trade).pool == "general"  # pinned
    limited = decide(policy, "v", _ctx("cheap"), 0.1, trade=trade)
    assert (limited.pool, limited.rule) == ("code", "trade")  # the best of the tiers it may use
    assert "among 2 tier(s)" in limited.route[0].why
    assert decide(policy, "v", _ctx("own"), 0.5, trade=trade).rule == "tenant-threshold"  # its own threshold


def _routed(loaded: LoadedPolicy, pool: str) -> RouteDecision:
    return RouteDecision(pool, pool, 0.5, "trade", "", loaded.version)


def test_moves_go_along_the_tiers() -> None:
    loaded = _policy("tiers: [general, code, flagship]", "tenants:\n  cheap: {allowed_pools: [general, code]}")
    policy, calm = loaded.policy, LadderState()
    assert neighbours(policy, "code") == ("flagship", "general")  # next up, then next down
    assert neighbours(policy, "general") == ("code", "flagship")
    assert neighbours(policy, "flagship") == ("code", "general")
    assert other_tiers(policy, _routed(loaded, "code"), "anyone", calm, False) == ("flagship", "general")
    assert other_tiers(policy, _routed(loaded, "code"), "cheap", calm, False) == ("general",)
    assert other_tiers(policy, _routed(loaded, "general"), "anyone", calm, True) == ()  # over budget: never up
    assert move_refused(policy, "anyone", "code", calm, True) is not None
    assert tier_above(policy, "general") == "code" and tier_above(policy, "flagship") is None


def test_the_cascade_escalates_one_tier_up() -> None:
    policy = _policy().policy
    assert escalation(policy, "anyone", LadderState(), False, "general").pool == "code"
    assert escalation(policy, "anyone", LadderState(), False, "code").pool == "flagship"
    top = escalation(policy, "anyone", LadderState(), False, "flagship")
    assert (top.pool, top.held) == (None, "top-tier")


def test_a_two_pool_policy_moves_as_before() -> None:
    loaded = _policy("micro_pool: general\n  flagship_pool: flagship")
    policy = loaded.policy
    assert other_tiers(policy, _routed(loaded, "general"), "anyone", LadderState(), False) == ("flagship",)
    assert other_tiers(policy, _routed(loaded, "code"), "anyone", LadderState(), False) == ()  # no tier
    assert escalation(policy, "anyone", LadderState(), False, "code").pool == "flagship"  # pool unused without tiers
    assert move_refused(policy, "anyone", "code", LadderState(), True) is None  # only the flagship is refused


def test_explain_shows_every_tier_and_the_trade() -> None:
    loaded = _policy("tiers: [general, code, flagship]\n  tradeoff: 100")
    exp = explain(loaded, _ctx(), 0.4, trade=_trade(0.6, 0.8, 0.95, 100))
    lines = render_explanation(exp, "given")
    assert "  1. trade -> 'code': best trade at tradeoff 100 among 3 tier(s): general=0.600/$0.000100, " \
           "code=0.800/$0.000400, flagship=0.950/$0.008000" in lines
    assert "  code: quality 0.800, expected $0.000400, trade 0.7600  <- the trade" in lines
    assert "  flagship: quality 0.950, expected $0.008000, trade 0.1500" in lines
