"""Each rule condition: matches, does not match, and says why not; score ranges and `needs_score`."""

from __future__ import annotations

from typing import Any

import pytest

from policies.context import RouteContext, estimate_tokens
from policies.decide import needs_score
from policies.loader import parse_policy
from policies.rules import RuleMatch

BASE = """
pools:
  micro: {type: remote, price: {input_per_mtok: 1, output_per_mtok: 1}, urls: [http://m], model: m}
  flagship: {type: remote, price: {input_per_mtok: 5, output_per_mtok: 5}, urls: [http://f], model: f}
routing:
  micro_pool: micro
  flagship_pool: flagship
"""


def _ctx(**kw: Any) -> RouteContext:
    base: dict[str, Any] = {"tenant": "acme", "requested_model": "auto", "prompt_text": "Hello SQL world"}
    return RouteContext(**(base | kw))


CASES: list[tuple[dict[str, Any], dict[str, Any], dict[str, Any], str]] = [
    ({"tenants": ["acme"]}, {}, {"tenant": "other"}, "tenant 'other' not in ['acme']"),
    ({"models": ["auto"]}, {}, {"requested_model": "gpt"}, "model 'gpt' not in ['auto']"),
    ({"metadata": {"source": ["ci", "cron"]}}, {"metadata": {"source": "ci"}}, {"metadata": {"source": "web"}},
     "metadata['source'] 'web' not in ['ci', 'cron']"),
    ({"headers": {"X-Plan": "^pro$"}}, {"headers": {"x-plan": "pro"}}, {"headers": {"x-plan": "free"}},
     "header 'x-plan' value 'free' does not match /^pro$/"),
    ({"headers": {"x-plan": "."}}, {"headers": {"x-plan": "pro"}}, {}, "header 'x-plan' absent"),
    ({"min_prompt_chars": 10}, {}, {"prompt_text": "short"}, "prompt chars 5 < min 10"),
    ({"max_prompt_chars": 10}, {"prompt_text": "short"}, {}, "prompt chars 15 > max 10"),
    ({"min_prompt_tokens": 5}, {"prompt_tokens": 5}, {}, "prompt tokens 4 < min 5"),
    ({"max_prompt_tokens": 3}, {"prompt_text": "x" * 12}, {"prompt_text": "x" * 13}, "prompt tokens 4 > max 3"),
    ({"keywords": ["sql"]}, {}, {"prompt_text": "hi"}, "none of the keywords ['sql']"),
    ({"regex": [r"\bS.L\b", "nomatch"]}, {}, {"prompt_text": "SQLs"}, "no regex matches"),
    ({"has_tools": True}, {"has_tools": True}, {}, "request has no tools"),
    ({"has_tools": False}, {}, {"has_tools": True}, "request has tools"),
    ({"json_response": True}, {"json_response": True}, {}, "no JSON response format"),
]


@pytest.mark.parametrize(("match", "yes", "no", "why"), CASES, ids=lambda c: str(c)[:30])
def test_each_condition(match: dict[str, Any], yes: dict[str, Any], no: dict[str, Any], why: str) -> None:
    rule = RuleMatch.model_validate(match)
    assert rule.why_not(_ctx(**yes), None) is None
    failure = rule.why_not(_ctx(**no), None)
    assert failure is not None and failure.startswith(why)


def test_score_range_is_inclusive_and_needs_a_score() -> None:
    rule = RuleMatch(min_score=0.2, max_score=0.4)
    assert rule.why_not(_ctx(), 0.2) is None and rule.why_not(_ctx(), 0.4) is None
    assert rule.why_not(_ctx(), 0.41) == "score 0.41 > max 0.4"
    assert rule.why_not(_ctx(), 0.1) == "score 0.1 < min 0.2"
    assert "no score" in str(rule.why_not(_ctx(), None))
    assert rule.why_not(_ctx(), None, check_score=False) is None


def test_all_conditions_must_hold_and_empty_is_catch_all() -> None:
    both = RuleMatch(tenants=("acme",), keywords=("nope",))
    assert both.why_not(_ctx(), None) == "none of the keywords ['nope']"
    assert RuleMatch().is_catch_all and RuleMatch().why_not(_ctx(tenant="x"), None) is None
    assert not both.is_catch_all


def test_token_estimate_and_context_from_request() -> None:
    assert (estimate_tokens(""), estimate_tokens("abcd"), estimate_tokens("abcde")) == (0, 1, 2)
    body = {
        "model": "auto",
        "messages": [{"role": "system", "content": "be brief"},
                     {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url"}]}],
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "response_format": {"type": "json_schema", "json_schema": {}},
        "metadata": {"source": "ci"},
    }
    ctx = RouteContext.from_request(body, "acme", {"X-Plan": "pro"})
    assert ctx.prompt_text == "be brief\nhi"
    assert (ctx.has_tools, ctx.json_response, ctx.metadata, ctx.headers) == (True, True, {"source": "ci"},
                                                                            {"x-plan": "pro"})
    assert ctx.tokens == estimate_tokens("be brief\nhi")
    bare = RouteContext.from_request({"messages": []}, "t", prompt_tokens=7)
    assert (bare.requested_model, bare.tokens, bare.has_tools, bare.json_response) == ("auto", 7, False, False)


def test_needs_score_with_score_ranges() -> None:
    policy = parse_policy(BASE + """  rules:
    - {name: easy, match: {max_score: 0.1}, pool: micro}
    - {name: sql, match: {keywords: [sql]}, pool: flagship}
""").policy
    # the score-range rule comes first: even a SQL prompt needs the score to know whether it fires
    assert needs_score(policy, _ctx())
    later = parse_policy(BASE + """  rules:
    - {name: sql, match: {keywords: [sql]}, pool: flagship}
    - {name: easy, match: {max_score: 0.1}, pool: micro}
    - {name: tools, match: {has_tools: true}, pool: flagship}
""").policy
    assert not needs_score(later, _ctx())
    assert needs_score(later, _ctx(prompt_text="hello"))
    assert not needs_score(later, _ctx(prompt_text="hello", requested_model="micro"))
