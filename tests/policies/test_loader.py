"""Policy loading: the shipped examples load; every kind of mistake is reported with file:line and a fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from policies.loader import PolicyError, load_policy, parse_policy
from policies.schema import Price
from tests.conftest import with_fixed_threshold

ROOT = Path(__file__).resolve().parents[2]
GOOD = with_fixed_threshold((ROOT / "policies" / "default.yaml").read_text())


@pytest.mark.parametrize("path", sorted((ROOT / "policies").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_policies_load(path: Path) -> None:
    loaded = load_policy(path)
    assert loaded.version and len(loaded.version) == 12


def test_version_is_content_hash() -> None:
    assert parse_policy(GOOD).version == parse_policy(GOOD).version
    assert parse_policy(GOOD).version != parse_policy(GOOD + "\n# changed\n").version


def _problems(text: str) -> list[str]:
    with pytest.raises(PolicyError) as err:
        parse_policy(text, "p.yaml")
    return err.value.problems


def test_unknown_key_names_line_path_and_fix() -> None:
    bad = GOOD.replace("kv_cache_space_gib: 1\n      base_port: 8101", "kv_cache_space_gb: 1\n      base_port: 8101")
    line = bad.splitlines().index("      kv_cache_space_gb: 1") + 1
    (problem,) = _problems(bad)
    assert problem.startswith(f"p.yaml:{line}: pools.micro.engine.kv_cache_space_gb")
    assert "unknown key: did you mean `kv_cache_space_gib`?" in problem
    (problem,) = _problems(GOOD.replace("threshold: 0.5", "treshold: 0.5"))
    assert "routing.treshold:" in problem and "did you mean `threshold`?" in problem
    (problem,) = _problems(GOOD.replace("served_name: micro", "served_name: micro\n      colour: blue"))
    assert "unknown key: check its spelling or remove it" in problem  # nothing close: no guess


def test_yaml_syntax_error_is_one_line_with_line_column_and_fix() -> None:
    bad = GOOD.replace("routing:\n", "routing: {\n", 1)
    (problem,) = _problems(bad)
    assert "\n" not in problem and "not valid YAML" in problem
    assert problem.startswith("p.yaml:") and "column" in problem and "check the indentation" in problem
    (problem,) = _problems(GOOD.replace("routing:\n  micro_pool", "routing:\n\tmicro_pool"))
    assert problem.startswith(f"p.yaml:{_line(GOOD, 'micro_pool')}: column 1: not valid YAML")
    assert "indent with spaces, not tabs" in problem


def test_a_bad_value_is_shown() -> None:
    (problem,) = _problems(GOOD.replace("threshold: 0.5", "threshold: high"))
    assert "routing.threshold: Input should be a valid number" in problem and "(got 'high')" in problem
    (problem,) = _problems(GOOD.replace("threshold: 0.5", "threshold: 1.5"))
    assert problem.endswith("less than or equal to 1 (got 1.5)")


def test_bad_price_and_bad_yaml_and_unknown_pool() -> None:
    (problem,) = _problems(GOOD.replace('"3.00"', '"three"'))
    assert "pools.flagship.price.input_per_mtok" in problem and "p.yaml:" in problem
    (problem,) = _problems(GOOD.replace("pools:\n", "pools:\n  - [\n"))
    assert "not valid YAML" in problem
    (problem,) = _problems(GOOD.replace("flagship_pool: flagship", "flagship_pool: big"))
    assert "unknown pool 'big'" in problem


def test_negative_or_too_precise_price_rejected() -> None:
    assert _problems(GOOD.replace('"3.00"', '"-1"'))
    assert _problems(GOOD.replace('"3.00"', '"0.0000001"'))


def test_threshold_out_of_range_and_rule_problems() -> None:
    assert "routing.threshold" in _problems(GOOD.replace("threshold: 0.5", "threshold: 1.5"))[0]
    rules = GOOD.replace("threshold: 0.5", """threshold: 0.5
  rules:
    - {name: a, pool: micro}
    - {name: a, pool: nowhere}
    - {name: b}""")
    problems = "\n".join(_problems(rules))
    assert "duplicate rule name 'a'" in problems
    assert "unknown pool 'nowhere'" in problems
    assert "exactly one of `pool` or `threshold`" in problems


def test_missing_file() -> None:
    with pytest.raises(PolicyError, match="cannot read"):
        load_policy("/nonexistent/policy.yaml")


def test_price_is_integer_micro_usd_rounded_once_per_request() -> None:
    price = Price(input_per_mtok="0.20", output_per_mtok="15.00")  # type: ignore[arg-type]
    assert (price.input_per_mtok, price.output_per_mtok) == (200_000, 15_000_000)
    assert price.cost_micro_usd(1_000_000, 0) == 200_000
    assert price.cost_micro_usd(10, 10) == 152  # 2 + 150
    assert price.cost_micro_usd(2, 0) == 0  # 0.4 micro-USD rounds to 0
    assert price.cost_micro_usd(3, 0) == 1  # 0.6 rounds up


def _line(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_duplicate_keys_are_errors_with_both_lines() -> None:
    bad = GOOD.replace("      served_name: micro\n", "      served_name: micro\n      served_name: other\n")
    (problem,) = _problems(bad)
    first, second = _line(bad, "served_name: micro"), _line(bad, "served_name: other")
    assert problem.startswith(f"p.yaml:{second}: pools.micro.engine.served_name: duplicate key 'served_name'")
    assert f"first at line {first}" in problem and "remove one" in problem
    (problem,) = _problems(GOOD + "routing:\n  micro_pool: micro\n  flagship_pool: micro\n")
    assert "(top level)" not in problem and "routing: duplicate key 'routing'" in problem


RULES = GOOD + """  rules:
    - {name: everything, pool: micro}
    - {name: never, match: {keywords: [x]}, pool: flagship}
    - {name: bad-range, match: {min_score: 0.8, max_score: 0.2}, pool: flagship}
"""


def test_cross_reference_errors_carry_lines() -> None:
    problems = _problems(RULES)
    assert problems[0] == (
        f"p.yaml:{_line(RULES, 'name: never')}: routing.rules[1]: rule 'never' is unreachable: rule 'everything' "
        "before it has an empty `match` and matches everything; move the catch-all last or give it conditions"
    )
    assert any(p.startswith(f"p.yaml:{_line(RULES, 'bad-range')}: routing.rules[2].match.min_score: min_score 0.8 >")
               for p in problems)
    bad = GOOD.replace("flagship_pool: flagship", "flagship_pool: big")
    (problem,) = _problems(bad)
    assert problem.startswith(f"p.yaml:{_line(bad, 'flagship_pool: big')}: routing.flagship_pool: unknown pool 'big'")


def test_bad_regex_is_a_load_error_with_line() -> None:
    bad = GOOD + "  rules:\n    - name: r\n      match: {regex: ['ok', '(unclosed']}\n      pool: micro\n"
    (problem,) = _problems(bad)
    assert problem.startswith(f"p.yaml:{_line(bad, 'unclosed')}: routing.rules[0].match.regex[1]:")
    assert "bad regular expression '(unclosed'" in problem and "missing )" in problem


LADDER = GOOD + """
degradation:
  steps:
    - {name: a, signal: kv_cache_usage, pool: flagship, enter_above: 0.8, exit_below: 0.8,
       action: {type: raise_threshold, threshold: 0.4}}
    - {name: a, signal: error_rate, pool: nowhere, enter_above: 5, exit_below: 0.1, action: {type: force_stream}}
    - {name: fb, signal: queue_depth, pool: flagship, enter_above: 9, exit_below: 1,
       action: {type: fallback_pool, to_pool: ghost}}
    - {name: over, signal: queue_depth, pool: flagship, enter_above: 9, exit_below: 1,
       action: {type: overflow, to_pool: micro}}
    - {name: self, signal: queue_depth, pool: micro, enter_above: 9, exit_below: 1,
       action: {type: fallback_pool, to_pool: micro}}
"""


def test_ladder_cross_reference_errors() -> None:
    problems = "\n".join(_problems(LADDER))
    expected = [
        f"p.yaml:{_line(LADDER, 'name: a, signal: kv')}: degradation.steps[0].exit_below: exit_below 0.8 must be <",
        "degradation.steps[0].action.threshold: raise_threshold 0.4 is not above routing.threshold 0.5",
        "degradation.steps[1].name: duplicate step name 'a'",
        "degradation.steps[1].pool: unknown pool 'nowhere'",
        "degradation.steps[1].enter_above: error_rate is a fraction 0..1",
        "degradation.steps[2].action.to_pool: unknown pool 'ghost'",
        "degradation.steps[3].action.to_pool: overflow goes to a remote pool; 'micro' is local",
        "degradation.steps[4].action.to_pool: to_pool is the pool it replaces ('micro')",
    ]
    for text in expected:
        assert text in problems
    assert "cycle" not in problems


def test_ladder_remap_cycle() -> None:
    cycle = GOOD + """
degradation:
  steps:
    - {name: there, signal: queue_depth, pool: flagship, enter_above: 9, exit_below: 1,
       action: {type: fallback_pool, to_pool: micro}}
    - {name: back, signal: queue_depth, pool: micro, enter_above: 9, exit_below: 1,
       action: {type: fallback_pool, to_pool: flagship}}
"""
    (problem,) = _problems(cycle)
    line = _line(cycle, "to_pool: flagship")
    assert problem.startswith(f"p.yaml:{line}: degradation.steps[1].action: pool moves form")


def test_unknown_action_type_and_key() -> None:
    bad = GOOD + """
degradation:
  steps:
    - {name: a, signal: queue_depth, pool: micro, enter_above: 9, exit_below: 1, action: {type: panic}}
    - {name: b, signal: queue_depth, pool: micro, enter_above: 9, exit_below: 1, action: {type: shed, below: 1}}
"""
    first, _missing, second = _problems(bad)
    assert first.startswith(f"p.yaml:{_line(bad, 'panic')}: degradation.steps[0].action:") and "fix the `type`" in first
    assert "degradation.steps[1].action.below:" in second and "unknown key" in second


def test_tenant_cross_references() -> None:
    digest = "ab" * 32
    bad = GOOD + f"""
tenants:
  a: {{api_key_sha256: [not-a-hash], allowed_pools: []}}
  b: {{api_key_sha256: ["{digest}"], allowed_pools: [micro, ghost]}}
  c: {{api_key_sha256: ["{digest}"]}}
"""
    problems = "\n".join(_problems(bad))
    assert "tenants.a.api_key_sha256[0]: not a lower-case hex SHA-256" in problems
    assert "tenants.a.allowed_pools: empty allowed_pools" in problems
    assert "tenants.b.allowed_pools[1]: unknown pool 'ghost'" in problems
    where = f"p.yaml:{_line(bad, '  c:')}: tenants.c.api_key_sha256[0]"
    assert f"{where}: the same key hash is already tenant 'b'" in problems


def test_a_price_in_both_forms_is_refused_at_its_line() -> None:
    both = GOOD.replace('{input_per_mtok: "0.20", output_per_mtok: "0.20"}',
                        '{input_per_mtok: "0.20", output_per_mtok: "0.20", gpu_hour_usd: 1}')
    (problem,) = _problems(both)
    assert problem.startswith(f"p.yaml:{_line(both, 'gpu_hour_usd')}: pools.micro.price:") and "not both" in problem
    (problem,) = _problems(GOOD.replace('{input_per_mtok: "0.20", output_per_mtok: "0.20"}', "{gpu_hour_usd: 1}"))
    assert "needs the measured throughput of one replica" in problem  # more in tests/policies/test_money.py


def test_malformed_budget_rejected_at_load() -> None:
    bad = GOOD + "tenants:\n  acme: {budget: {daily_usd: \"-5\"}}\n"
    assert any("tenants.acme.budget.daily_usd" in p for p in _problems(bad))
    bad = GOOD + "tenants:\n  acme: {budget: {monthly_usd: \"lots\", on_exceed: explode}}\n"
    problems = "\n".join(_problems(bad))
    assert "monthly_usd" in problems and "on_exceed" in problems
