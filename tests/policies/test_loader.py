"""Policy loading: the shipped examples load; every kind of mistake is reported with file:line and a fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from policies.loader import PolicyError, load_policy, parse_policy
from policies.schema import Price

ROOT = Path(__file__).resolve().parents[2]
GOOD = (ROOT / "policies" / "default.yaml").read_text()


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
    assert "unknown key" in problem


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
