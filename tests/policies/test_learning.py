"""The policy's `learning:` section: off by default, USD budgets in micro-USD, cross-references with file:line."""

from __future__ import annotations

from pathlib import Path

import pytest

from policies.loader import PolicyError, parse_policy
from policies.schema import Policy
from tests.conftest import policy_yaml

BASE = policy_yaml("http://127.0.0.1:1", "http://127.0.0.1:2")


def _problems(text: str) -> list[str]:
    with pytest.raises(PolicyError) as err:
        parse_policy(text, "p.yaml")
    return err.value.problems


def test_off_by_default() -> None:
    learning = parse_policy(BASE).policy.learning
    assert learning.keep_prompts.sample == 0 and learning.keep_prompts.ttl_days == 30
    assert learning.shadow.sample == 0 and learning.shadow.daily_budget_usd == 0 and learning.shadow.judge_pool is None


def test_a_full_section_parses_usd_into_micro_usd() -> None:
    text = BASE + """learning:
  keep_prompts: {sample: 0.1, ttl_days: 7}
  shadow: {sample: 0.05, judge_pool: flagship, flagship_pool: flagship, daily_budget_usd: "2.50", max_tokens: 64}
"""
    learning = parse_policy(text).policy.learning
    assert (learning.keep_prompts.sample, learning.keep_prompts.ttl_days) == (0.1, 7)
    assert learning.shadow.daily_budget_usd == 2_500_000
    assert (learning.shadow.judge_pool, learning.shadow.max_tokens) == ("flagship", 64)


def test_unknown_pools_are_named_with_their_line() -> None:
    text = BASE + "learning:\n  keep_prompts: {sample: 1}\n  shadow:\n    sample: 1\n    judge_pool: judgy\n"
    (problem,) = _problems(text)
    line = text.splitlines().index("    judge_pool: judgy") + 1
    assert problem.startswith(f"p.yaml:{line}: learning.shadow.judge_pool: unknown pool 'judgy'")


def test_shadow_needs_a_judge_and_kept_prompts() -> None:
    problems = _problems(BASE + "learning:\n  shadow: {sample: 0.5}\n")
    assert any("learning.shadow.judge_pool: shadow comparisons need a judge" in p for p in problems)
    assert any("learning.shadow.sample: shadow compares kept requests only" in p for p in problems)
    assert len(problems) == 2


def test_both_orders_needs_a_judge_and_a_boolean() -> None:
    text = BASE + "learning:\n  shadow:\n    both_orders: true\n"
    (problem,) = _problems(text)
    line = text.splitlines().index("    both_orders: true") + 1
    assert problem.startswith(f"p.yaml:{line}: learning.shadow.both_orders: both_orders judges with the judge pool")
    (problem,) = _problems(BASE + "learning:\n  shadow: {judge_pool: flagship, both_orders: sometimes}\n")
    assert ": learning.shadow.both_orders:" in problem
    both = parse_policy(BASE + "learning:\n  shadow: {judge_pool: flagship, both_orders: true}\n").policy
    assert both.learning.shadow.both_orders is True and parse_policy(BASE).policy.learning.shadow.both_orders is False


@pytest.mark.parametrize("bad, where", [
    ("learning:\n  keep_prompts: {sample: 1.5}\n", "learning.keep_prompts.sample"),
    ("learning:\n  shadow: {daily_budget_usd: '-1'}\n", "learning.shadow.daily_budget_usd"),
    ("learning:\n  keep_prompt: {sample: 0.1}\n", "learning.keep_prompt"),
])
def test_schema_errors_name_the_field(bad: str, where: str) -> None:
    (problem,) = _problems(BASE + bad)
    assert f": {where}:" in problem


def test_json_schema_lists_the_section() -> None:
    schema = Policy.model_json_schema()
    assert "learning" in schema["properties"]
    shadow = schema["$defs"]["Shadow"]["properties"]
    assert {"sample", "judge_pool", "flagship_pool", "daily_budget_usd", "max_tokens", "both_orders"} <= set(shadow)


def test_the_commented_example_in_the_default_policy_is_valid() -> None:
    text = (Path(__file__).resolve().parents[2] / "policies" / "default.yaml").read_text()
    assert parse_policy(text).policy.learning.keep_prompts.sample == 0  # shipped: off
    example = text[text.index("# learning:"):].splitlines()
    learning = parse_policy(text + "\n" + "\n".join(line[2:] for line in example if line.startswith("# "))).policy
    assert learning.learning.shadow.judge_pool == "flagship" and learning.learning.keep_prompts.sample == 0.05


def test_retrain_is_off_by_default_and_parses() -> None:
    retrain = parse_policy(BASE).policy.learning.retrain
    assert (retrain.every_hours, retrain.min_new_labels, retrain.held_back, retrain.embedder) == (0, 200, 0.3, None)
    text = BASE + """learning:
  keep_prompts: {sample: 0.1}
  retrain: {every_hours: 24, min_new_labels: 500, held_back: 0.25, embedder: "all-MiniLM-L6-v2:static",
            timeout_minutes: 30}
"""
    retrain = parse_policy(text).policy.learning.retrain
    assert (retrain.every_hours, retrain.min_new_labels, retrain.held_back) == (24, 500, 0.25)
    assert (retrain.embedder, retrain.timeout_minutes) == ("all-MiniLM-L6-v2:static", 30)


def test_retrain_without_kept_prompts_is_refused_with_its_line() -> None:
    text = BASE + "learning:\n  retrain:\n    every_hours: 24\n"
    (problem,) = _problems(text)
    line = text.splitlines().index("    every_hours: 24") + 1
    assert problem.startswith(f"p.yaml:{line}: learning.retrain.every_hours: retraining learns from kept "
                              "requests only, and learning.keep_prompts.sample is 0")
    parse_policy(BASE + "learning:\n  retrain: {every_hours: 0}\n")  # off needs nothing


@pytest.mark.parametrize("bad, where", [
    ("retrain: {every_hours: -1}", "learning.retrain.every_hours"),
    ("retrain: {every_hours: 24, held_back: 0}", "learning.retrain.held_back"),
    ("retrain: {every_hours: 24, min_new_labels: 3}", "learning.retrain.min_new_labels"),
    ("retrain: {every_hours: 24, timeout_minute: 5}", "learning.retrain.timeout_minute"),
])
def test_retrain_schema_errors_name_the_field(bad: str, where: str) -> None:
    (problem,) = _problems(BASE + f"learning:\n  keep_prompts: {{sample: 0.1}}\n  {bad}\n")
    assert f": {where}:" in problem


def test_json_schema_lists_the_retrain_fields() -> None:
    retrain = Policy.model_json_schema()["$defs"]["Retrain"]["properties"]
    assert set(retrain) == {"every_hours", "min_new_labels", "held_back", "embedder", "timeout_minutes"}
    assert all(field.get("description") for field in retrain.values())


def test_in_domain_defaults_and_its_sampling_factor() -> None:
    spec = parse_policy(BASE).policy.learning.in_domain
    assert (spec.bound, spec.drift_share, spec.hold) == (0.3, 0.4, None)
    assert spec.sampling_factor(None) == 1.0 and spec.sampling_factor(1.0) == 1.0
    assert spec.sampling_factor(0.0) == 4.0 and spec.sampling_factor(0.5) == 2.5


def test_in_domain_bound_is_counted_in_tenths_and_the_window_must_hold_the_minimum() -> None:
    text = BASE + "learning:\n  in_domain:\n    bound: 0.25\n"
    (problem,) = _problems(text)
    line = text.splitlines().index("    bound: 0.25") + 1
    assert problem.startswith(f"p.yaml:{line}: learning.in_domain.bound:") and "multiple of 0.1" in problem
    (problem,) = _problems(BASE + "learning:\n  in_domain: {window: 50, min_requests: 60}\n")
    assert "min_requests (60) cannot exceed window (50)" in problem


def test_a_hold_needs_the_tenants_own_label_memory() -> None:
    text = BASE + "learning:\n  in_domain:\n    hold: {threshold: 0.2, until_labels: 50}\n"
    (problem,) = _problems(text)
    assert "learning.in_domain.hold: hold waits for the drifting tenant's own labels" in problem
    held = parse_policy(text + "  label_memory: {scope: tenant}\n").policy.learning.in_domain.hold
    assert held is not None and (held.threshold, held.until_labels) == (0.2, 50)
