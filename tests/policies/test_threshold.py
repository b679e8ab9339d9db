"""`routing.threshold`: the float and the flagship-share forms, their errors, decisions and the line edit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from policies.context import RouteContext
from policies.decide import decide
from policies.ladder import LadderState
from policies.loader import PolicyError, parse_policy
from policies.schema import Policy, ShareThreshold
from policies.threshold_edit import ThresholdEditError, set_routing_threshold
from tests.conftest import policy_yaml

BASE = policy_yaml("http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1")
LINE = BASE.splitlines().index("  threshold: 0.5") + 1
AUTO = RouteContext(tenant="t", requested_model="auto", prompt_text="hi")


def _with(threshold: str, extra: str = "") -> str:
    return BASE.replace("  threshold: 0.5\n", f"  threshold: {threshold}\n") + extra


def _problems(text: str) -> list[str]:
    with pytest.raises(PolicyError) as err:
        parse_policy(text, "p.yaml")
    return err.value.problems


def test_float_and_share_forms_load() -> None:
    assert parse_policy(_with("0.4")).policy.routing.threshold == 0.4
    share = parse_policy(_with("{flagship_share: 0.3, window: 500, initial: 0.6}")).policy.routing.threshold
    assert share == ShareThreshold(flagship_share=0.3, window=500, initial=0.6, min_samples=200)
    block = parse_policy(_with("\n    flagship_share: 0.25")).policy.routing.threshold
    assert isinstance(block, ShareThreshold) and block.window == 2000 and block.initial == 0.5


@pytest.mark.parametrize(("value", "message"), [
    ("1.5", "routing.threshold: Input should be less than or equal to 1 (got 1.5)"),
    ("{flagship_share: 1.0}", "routing.threshold.flagship_share: Input should be less than 1"),
    ("{flagship_share: 0}", "routing.threshold.flagship_share: Input should be greater than 0"),
    ("{flagship_share: 0.3, initial: 2}", "routing.threshold.initial: Input should be less than or equal to 1"),
    ("{flagship_share: 0.3, window: 5}", "routing.threshold.window: Input should be greater than or equal to 10"),
    ("{flagship_share: 0.3, window: 50, min_samples: 100}", "min_samples 100 exceeds window 50"),
    ("{flagship_share: 0.3, windw: 50}", "routing.threshold.windw: Extra inputs are not permitted (unknown key: did "
     "you mean `window`?"),
    ("{share: 0.3}", "routing.threshold.flagship_share: Field required"),
    ("high", "routing.threshold: Input should be a valid number"),
])
def test_bad_values_name_file_line_and_path(value: str, message: str) -> None:
    problems = _problems(_with(value))
    assert any(p.startswith(f"p.yaml:{LINE}: ") and message in p for p in problems), problems
    assert not any(".share." in p or ".value" in p for p in problems)  # pydantic's union tags stay hidden


LADDER = """degradation:
  steps:
    - {name: hot, pool: flagship, signal: queue_depth, enter_above: 10, exit_below: 5,
       action: {type: raise_threshold, threshold: 0.6}}
"""


def test_raise_threshold_is_checked_against_initial() -> None:
    parse_policy(_with("{flagship_share: 0.3, initial: 0.5}", LADDER))
    (problem,) = _problems(_with("{flagship_share: 0.3, initial: 0.7}", LADDER))
    assert "raise_threshold 0.6 is not above routing.threshold 0.7" in problem


def _policy(threshold: str) -> Policy:
    return parse_policy(_with(threshold)).policy


def test_decide_uses_the_live_threshold_else_initial() -> None:
    policy = _policy("{flagship_share: 0.3, initial: 0.8}")
    assert decide(policy, "v", AUTO, 0.7).pool == "micro"  # initial 0.8
    assert decide(policy, "v", AUTO, 0.7, threshold=0.65).pool == "flagship"
    assert decide(policy, "v", AUTO, 0.6, threshold=0.65).pool == "micro"
    assert decide(_policy("0.5"), "v", AUTO, 0.6).pool == "flagship"


def test_tenant_threshold_and_ladder_still_apply_over_a_live_one() -> None:
    policy = parse_policy(_with("{flagship_share: 0.3}", "tenants:\n  t: {threshold: 0.9}\n")).policy
    decision = decide(policy, "v", AUTO, 0.7, threshold=0.2)
    assert decision.pool == "micro" and decision.rule == "tenant-threshold"
    other = RouteContext(tenant="other", requested_model="auto", prompt_text="hi")
    ladder = LadderState(threshold=0.75, threshold_step="hot")
    raised = decide(policy, "v", other, 0.7, ladder, threshold=0.2)
    assert raised.pool == "micro" and raised.rule == "ladder:hot"


def test_json_schema_offers_both_forms() -> None:
    schema = Policy.model_json_schema()
    text = json.dumps(schema["$defs"]["Routing"]["properties"]["threshold"])
    assert "ShareThreshold" in text and '"number"' in text
    assert set(schema["$defs"]["ShareThreshold"]["properties"]) == {"flagship_share", "window", "initial",
                                                                    "min_samples"}


EDIT_TEXT = """# ops notes
pools: {}
routing:
  micro_pool: micro   # cheap
  # the split
  threshold: 0.5  # tuned in May
  flagship_pool: flagship
tenants: {}
"""


def test_edit_replaces_only_the_threshold_line_and_keeps_its_comment() -> None:
    out = set_routing_threshold(EDIT_TEXT, "0.42")
    assert out == EDIT_TEXT.replace("threshold: 0.5  # tuned in May", "threshold: 0.42  # tuned in May")


def test_edit_replaces_a_share_form_and_inserts_a_missing_line() -> None:
    block = EDIT_TEXT.replace("  threshold: 0.5  # tuned in May\n", "  threshold:\n    flagship_share: 0.3\n")
    assert set_routing_threshold(block, "0.42") == EDIT_TEXT.replace("0.5  # tuned in May", "0.42")
    flow = EDIT_TEXT.replace("0.5  # tuned in May", "{flagship_share: 0.3}  # target")
    assert "  threshold: 0.42\n" in set_routing_threshold(flow, "0.42")
    missing = EDIT_TEXT.replace("  threshold: 0.5  # tuned in May\n", "")
    assert set_routing_threshold(missing, "0.42") == missing.replace("routing:\n", "routing:\n  threshold: 0.42\n")
    rule = missing.replace("tenants: {}", "tenants:\n  acme:\n    threshold: 0.3")
    assert "    threshold: 0.3\n" in set_routing_threshold(rule, "0.42")  # another block's threshold is left alone


def test_edit_refuses_flow_style_routing(tmp_path: Path) -> None:
    with pytest.raises(ThresholdEditError, match="routing"):
        set_routing_threshold("routing: {micro_pool: a, flagship_pool: b}\n", "0.4")


def _log(path: Path, scores: list[float]) -> None:
    path.write_text("".join(json.dumps({"request": {"model": "auto", "messages": [{"role": "user", "content": "q"}]},
                                        "tenant": "t", "score": s, "pool": "micro", "prompt_tokens": 10,
                                        "completion_tokens": 1}) + "\n" for s in scores))


def test_explain_and_replay_say_which_threshold_they_use(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from gateway.cli.policy import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    policy, log = tmp_path / "p.yaml", tmp_path / "log.jsonl"
    policy.write_text(_with("{flagship_share: 0.3, initial: 0.6}"))
    _log(log, [0.1, 0.55, 0.7])

    def run(*argv: str) -> str:
        args = parser.parse_args(argv)
        assert args.func(args) == 0
        return capsys.readouterr().out

    out = run("policy", "explain", str(policy), "--prompt", "hi", "--score", "0.55")
    assert "pool 'micro'" in out and "used here: its `initial` 0.6" in out
    assert "--gateway URL (or --redis-url URL --prefix P): the threshold a running gateway uses" in out
    out = run("policy", "explain", str(policy), "--prompt", "hi", "--score", "0.55", "--threshold", "0.5")
    assert "pool 'flagship'" in out and "routing threshold 0.5 (--threshold)" in out
    out = run("policy", "replay", str(policy), "--log", str(log))
    assert "1 move pools" in out and "its `initial` 0.6" in out  # only 0.7 moves at 0.6
    assert "--gateway" not in out  # replay asks no gateway
    out = run("policy", "replay", str(policy), "--log", str(log), "--threshold", "0.5")
    assert "2 move pools" in out
