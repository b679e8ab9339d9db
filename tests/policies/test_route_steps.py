"""The route a decision carries: each step of `decide` appends its entry (step, pool, why); `policy explain` shows
the same steps and the context step. No entry carries prompt text."""

from __future__ import annotations

from policies.context import RouteContext
from policies.decide import RouteDecision, RouteStep, decide, route_text
from policies.explain import explain, render_explanation
from policies.loader import parse_policy
from tests.conftest import policy_yaml
from tests.policies.test_decide import LOADED, POLICY, TENANTS, _state, _step

SECRET = "the launch code is 0000 and SQL"  # prompt text: never in a route


def _route(ctx: RouteContext, score: float | None, **kwargs: object) -> tuple[RouteStep, ...]:
    route = decide(POLICY, LOADED.version, ctx, score, **kwargs).route  # type: ignore[arg-type]
    assert route and all(SECRET not in step.why and "0000" not in step.why for step in route)
    return route


def test_a_threshold_decision_is_one_score_step_naming_the_threshold() -> None:
    assert _route(RouteContext("default", "auto", SECRET.replace("SQL", "")), 0.2) == (
        RouteStep("score", "micro", "score 0.200 < 0.5 (threshold)"),)
    assert _route(RouteContext("strict", "auto", "hi"), 0.2) == (
        RouteStep("score", "flagship", "score 0.200 >= 0.1 (tenant-threshold)"),)
    assert _route(RouteContext("default", "auto", "hi"), None) == (
        RouteStep("score", "micro", "no score: the micro pool"),)


def test_a_rule_that_names_a_pool_and_a_pinned_model_are_their_own_steps() -> None:
    assert _route(RouteContext("default", "auto", SECRET), 0.0) == (RouteStep("rule:sql-to-flagship", "flagship",
                                                                              "matched"),)
    assert _route(RouteContext("default", "gpt-4o-mini", SECRET), None) == (
        RouteStep("pinned", "micro", "the requested model names it"),)


def test_a_tenant_cut_to_its_allowed_pools_is_a_step() -> None:
    loaded = parse_policy(TENANTS)
    d = decide(loaded.policy, loaded.version, RouteContext("free", "auto", "hello"), 0.9)
    assert [(s.step, s.pool) for s in d.route] == [("score", "flagship"), ("tenant", "micro")]
    assert d.route[-1].why == "may not use 'flagship': its first allowed pool"


def test_ladder_steps_that_move_the_request_are_steps() -> None:
    raised = _route(RouteContext("default", "auto", "hi"), 0.6,
                    ladder=_state(_step("kv", {"type": "raise_threshold", "threshold": 0.8})))
    assert raised == (RouteStep("score", "flagship", "score 0.600 >= 0.5 (threshold)"),
                      RouteStep("ladder:kv", "micro", "threshold raised to 0.8"))
    moved = _route(RouteContext("default", "auto", "hi"), 0.9,
                   ladder=_state(_step("to-micro", {"type": "fallback_pool", "to_pool": "micro"})))
    assert moved == (RouteStep("score", "flagship", "score 0.900 >= 0.5 (threshold)"),
                     RouteStep("ladder:to-micro", "micro", "to-micro moves 'flagship'"))


def test_then_appends_a_step_with_the_pool_after_it_and_the_header_text_lists_them() -> None:
    d = RouteDecision("micro", "m", 0.1, "threshold", "scored", "v1", route=(RouteStep("score", "micro", "low"),))
    later = d.then("context-fit", "too long", pool="flagship", rule="context-fit")
    assert later.route[-1] == RouteStep("context-fit", "flagship", "too long") and later.pool == "flagship"
    assert d.then("canary", "v2 takes 10%").route[-1] == RouteStep("canary", "micro", "v2 takes 10%")
    assert route_text(later.route) == "score:micro, context-fit:flagship"


def test_explain_shows_the_score_then_the_context_step_for_a_prompt_micro_cannot_hold() -> None:
    text = policy_yaml("http://127.0.0.1:1", "http://127.0.0.1:2").replace(
        'model: micro-model\n', 'model: micro-model\n    context_tokens: 64\n')
    loaded = parse_policy(text, "policy.yaml")
    long = RouteContext("default", "auto", "word " * 200)  # ~250 estimated tokens: over micro's 64
    exp = explain(loaded, long, 0.1, completion=16)
    assert exp.decision is not None and route_text(exp.decision.route) == "score:micro, context-fit:flagship"
    lines = render_explanation(exp, "given")
    at = lines.index("route:")
    assert lines[at + 1] == "  1. score -> 'micro': score 0.100 < 0.5 (threshold)"
    assert lines[at + 2].startswith("  2. context-fit -> 'flagship': ")
    assert "prompt tokens (estimated) and 16 completion do not fit 'micro' (64 tokens)" in lines[at + 2]
    short = explain(loaded, RouteContext("default", "auto", "hello"), 0.1, completion=16)
    assert short.decision is not None and route_text(short.decision.route) == "score:micro"
    pinned = explain(loaded, RouteContext("default", "micro", "word " * 200), None, completion=16)
    assert pinned.decision is None and pinned.refusal is not None and pinned.refusal.startswith("400: ")
