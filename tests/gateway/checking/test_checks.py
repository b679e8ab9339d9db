"""The output checks one by one, their resolution from the policy, the verdict, and the request schemas' 400s."""

from __future__ import annotations

import random
from typing import Any

import pytest

from gateway.checking.checks import applies, empty_ok, json_ok, repetition_ok, tool_calls_ok
from gateway.checking.judge import JsonRates, OutputChecker, Verdict
from gateway.checking.schemas import check_request_schemas
from gateway.errors import BadRequest
from policies.decide import RouteDecision
from policies.output_checks import OutputChecks, Repetition, resolve
from policies.schema import Policy

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
AS_SCHEMA = {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}}
AS_OBJECT = {"response_format": {"type": "json_object"}}
TOOLS = {"tools": [{"type": "function", "function": {"name": "lookup", "parameters": SCHEMA}}]}


def _msg(content: Any = None, calls: Any = None) -> dict[str, Any]:
    return {"role": "assistant", "content": content, **({"tool_calls": calls} if calls is not None else {})}


@pytest.mark.parametrize(("content", "raw", "ok"), [
    ('{"n": 1}', AS_OBJECT, True),
    ('  {"a": [1, 2]}\n', AS_OBJECT, True),
    ("[1, 2]", AS_OBJECT, False),  # json_object mode answers an object
    ('Sure! {"n": 1}', AS_OBJECT, False),
    ('{"n": 1', AS_OBJECT, False),
    (None, AS_OBJECT, False),
    ('{"n": 3}', AS_SCHEMA, True),
    ('{"n": "3"}', AS_SCHEMA, False),
    ("{}", AS_SCHEMA, False),
    ("not json at all", {}, True),  # no JSON asked for: the check does not judge it
])
def test_json_check(content: str | None, raw: dict[str, Any], ok: bool) -> None:
    assert json_ok(_msg(content), raw) is ok


def test_a_tool_call_answer_is_left_to_the_tool_calls_check() -> None:
    call = [{"type": "function", "function": {"name": "lookup", "arguments": '{"n": 1}'}}]
    assert json_ok(_msg(None, call), {**AS_OBJECT, **TOOLS})


@pytest.mark.parametrize(("name", "arguments", "ok"), [
    ("lookup", '{"n": 7}', True),
    ("lookup", '{"n": "seven"}', False),
    ("lookup", '{"n": 7', False),
    ("lookup", "[7]", False),
    ("other", '{"n": 7}', False),  # a tool the request did not offer
])
def test_tool_calls_check(name: str, arguments: str, ok: bool) -> None:
    call = [{"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}]
    assert tool_calls_ok(_msg(None, call), TOOLS) is ok
    assert tool_calls_ok(_msg("no call"), TOOLS)


def test_empty_check() -> None:
    assert not empty_ok(_msg(""))
    assert not empty_ok(_msg(" \n\t"))
    assert not empty_ok(_msg(None))
    assert empty_ok(_msg("0"))
    assert empty_ok(_msg(None, [{"function": {"name": "lookup", "arguments": "{}"}}]))


LOOP = "Intro text first. " + "the cat sat down and " * 30
PROSE = ("The report covers three quarters. Revenue grew in the first, fell in the second as two contracts "
         "ended, and recovered in the third when the new region opened. Costs tracked revenue except for a "
         "one-off charge for the office move, which the board approved in March. ") * 2


def test_repetition_check_catches_a_loop_cut_by_the_token_limit() -> None:
    loop = Repetition()
    assert not repetition_ok(_msg(LOOP), "length", loop)
    assert repetition_ok(_msg(LOOP), "stop", loop)  # the model left the loop by itself
    assert repetition_ok(_msg(PROSE), "length", loop)  # a repeated paragraph is not 8 repeats of one 4-gram
    assert not repetition_ok(_msg("哈" * 300), "length", loop)  # no spaces: characters are the words
    assert repetition_ok(_msg(LOOP), "length", Repetition(ngram=4, max_repeats=1000))


def test_which_checks_apply() -> None:
    assert applies("json", AS_OBJECT) and not applies("json", {})
    assert applies("tool_calls", TOOLS) and not applies("tool_calls", {})
    assert applies("empty", {}) and applies("repetition", {})


def test_the_most_specific_block_wins_per_check() -> None:
    top = OutputChecks.model_validate({"json": "flag", "empty": "retry", "repetition": "flag"})
    pool = OutputChecks.model_validate({"json": "escalate", "loop": {"ngram": 3, "max_repeats": 5}})
    tenant = OutputChecks.model_validate({"repetition": "off"})
    actions, loop = resolve((tenant, pool, top))
    assert actions == {"json": "escalate", "empty": "retry"}
    assert (loop.ngram, loop.max_repeats) == (3, 5)
    assert resolve((None, None, None)) == ({}, Repetition())


def test_unknown_check_or_action_is_refused() -> None:
    with pytest.raises(ValueError, match="json"):
        OutputChecks.model_validate({"json": "explode"})
    with pytest.raises(ValueError, match="jsonn"):
        OutputChecks.model_validate({"jsonn": "flag"})


def test_verdict_picks_the_strongest_action_of_the_failed_checks() -> None:
    verdict = Verdict({"json": "fail", "empty": "pass", "repetition": "fail"},
                      {"json": "retry", "empty": "escalate", "repetition": "flag"})
    assert verdict.failed == ("json", "repetition")
    assert verdict.action == "retry"  # empty passed: its escalate does not count
    assert verdict.summary == "fail:json,repetition"
    assert verdict.header == "json=fail, empty=pass, repetition=fail"
    assert Verdict({"json": "pass"}, {"json": "escalate"}).action is None
    assert Verdict({}, {}).summary == ""


def _policy(**extra: Any) -> Policy:
    base = {"pools": {"micro": {"type": "remote", "urls": ["http://x"], "model": "m",
                                "price": {"input_per_mtok": "0.1", "output_per_mtok": "0.1"}}},
            "routing": {"micro_pool": "micro", "flagship_pool": "micro"}}
    return Policy.model_validate({**base, **extra})


DECISION = RouteDecision("micro", "m", 0.1, "threshold", "", "1")


def test_a_check_that_raises_is_an_error_and_the_answer_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_: Any) -> bool:
        raise RuntimeError("broken check")

    monkeypatch.setattr("gateway.checking.judge.empty_ok", boom)
    checker = OutputChecker()
    answer = {"choices": [{"message": _msg(""), "finish_reason": "stop"}]}
    verdict = checker.judge(_policy(output_checks={"empty": "escalate"}), "t", DECISION, {}, answer)
    assert verdict.results == {"empty": "error"} and verdict.action is None


def test_judge_counts_the_json_failure_rate_per_pool() -> None:
    checker = OutputChecker()
    policy = _policy(output_checks={"json": "flag"})
    for content in ('{"n": 1}', "nope", "nope", '{"n": 2}'):
        checker.judge(policy, "t", DECISION, AS_OBJECT, {"choices": [{"message": _msg(content)}]})
    checker.judge(policy, "t", DECISION, {}, {"choices": [{"message": _msg("text")}]})  # no JSON asked: not counted
    assert checker.json_rates.rate("micro", 50) == (0.5, 4)
    assert checker.json_rates.rate("micro", 2) == (0.5, 2)
    assert JsonRates().rate("micro", 10) == (0.0, 0)


def test_json_rates_equal_a_recount_of_the_last_answers_kept() -> None:
    """Kept as running counts (a rate is a difference of two, not a pass over the window), the rate over the last
    n answers equals a recount of them, also once the oldest leave the kept window."""
    rng = random.Random(5)
    rates, seen = JsonRates(window=50), []
    for _ in range(300):
        failed = rng.random() < 0.3
        rates.observe("micro", failed)
        seen.append(failed)
        for n in (1, 7, 50, 80):
            last = seen[-min(n, 50):]
            assert rates.rate("micro", n) == (sum(last) / len(last), len(last))
    assert rates.rate("flagship", 10) == (0.0, 0) and rates.rate("micro", 0) == (0.0, 0)


@pytest.mark.parametrize(("raw", "param"), [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": "a string"}}},
     "response_format.json_schema.schema"),
    ({"tools": [TOOLS["tools"][0], {"type": "function", "function": {"name": "b", "parameters":
                                                                       {"required": "n"}}}]},
     "tools[1].function.parameters"),
])
def test_a_schema_that_is_not_a_json_schema_is_a_400_naming_its_field(raw: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequest) as caught:
        check_request_schemas(raw)
    assert caught.value.param == param and caught.value.status == 400
    check_request_schemas({**AS_SCHEMA, **TOOLS})  # valid ones pass
