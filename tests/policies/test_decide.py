"""Routing decisions: pinned models, rules, thresholds (global, tenant, rule), no score."""

from __future__ import annotations

from pathlib import Path

import pytest

from policies.decide import ModelNotRouted, PoolNotAllowed, RouteContext, decide, needs_score, pinned_pool
from policies.ladder import ActiveStep, LadderState
from policies.loader import parse_policy
from policies.schema import LadderStep
from tests.conftest import with_fixed_threshold

ROOT = Path(__file__).resolve().parents[2]
TEXT = with_fixed_threshold((ROOT / "policies" / "default.yaml").read_text(), """0.5
  rules:
    - {name: sql-to-flagship, match: {keywords: [SQL]}, pool: flagship}
    - {name: acme-lenient, match: {tenants: [acme]}, threshold: 0.9}
aliases:
  gpt-4o-mini: micro
tenants:
  strict: {threshold: 0.1}
""")
LOADED = parse_policy(TEXT)
POLICY = LOADED.policy


def _decide(prompt: str, score: float | None, tenant: str = "default", model: str = "auto") -> tuple[str, str]:
    d = decide(POLICY, LOADED.version, RouteContext(tenant, model, prompt), score)
    assert d.policy_version == LOADED.version
    return d.pool, d.rule


def test_threshold_splits_by_score() -> None:
    assert _decide("hello", 0.2) == ("micro", "threshold")
    assert _decide("hello", 0.5) == ("flagship", "threshold")


def test_rules_first_match_wins() -> None:
    assert _decide("write sql for me", 0.0) == ("flagship", "sql-to-flagship")
    assert _decide("hello", 0.8, tenant="acme") == ("micro", "acme-lenient")
    assert _decide("hello", 0.95, tenant="acme") == ("flagship", "acme-lenient")
    assert _decide("hello", 0.2, tenant="strict") == ("flagship", "tenant-threshold")


def test_pinned_models_and_aliases() -> None:
    assert pinned_pool(POLICY, "flagship") == "flagship"
    assert pinned_pool(POLICY, "gpt-4o-mini") == "micro"
    assert pinned_pool(POLICY, "nope") is None
    assert _decide("x", None, model="gpt-4o-mini") == ("micro", "pinned")


def test_score_needed_only_when_it_decides() -> None:
    assert needs_score(POLICY, RouteContext("default", "auto", "hello"))
    assert not needs_score(POLICY, RouteContext("default", "auto", "SQL please"))
    assert not needs_score(POLICY, RouteContext("default", "micro", "hello"))
    assert _decide("hello", None) == ("micro", "no-score")


TENANTS = (ROOT / "policies" / "multi-tenant.yaml").read_text()


def test_allowed_pools_fall_back_and_pinning_refused() -> None:
    loaded = parse_policy(TENANTS)
    d = decide(loaded.policy, loaded.version, RouteContext("free", "auto", "hello"), 0.9)
    assert (d.pool, d.rule) == ("micro", "threshold")
    assert "tenant 'free' may not use 'flagship': sent to 'micro'" in d.reason
    with pytest.raises(PoolNotAllowed) as err:
        decide(loaded.policy, loaded.version, RouteContext("free", "flagship", "hello"), None)
    assert (err.value.tenant, err.value.pool, err.value.allowed) == ("free", "flagship", ("micro",))
    assert decide(loaded.policy, loaded.version, RouteContext("initech", "auto", "x"), 0.9).pool == "flagship"


def test_metadata_and_header_rules_in_a_policy() -> None:
    loaded = parse_policy(TENANTS)
    ci = RouteContext("acme", "auto", "x", metadata={"source": "ci"})
    assert decide(loaded.policy, loaded.version, ci, None).rule == "acme-ci"
    premium = RouteContext("globex", "auto", "x", headers={"x-plan": "premium"})
    d = decide(loaded.policy, loaded.version, premium, 0.27)  # premium's rule threshold 0.25 < 0.27 < 0.28
    assert (d.pool, d.rule) == ("flagship", "globex-premium")
    assert decide(loaded.policy, loaded.version, RouteContext("globex", "auto", "x"), 0.27).pool == "micro"


def _state(*steps: LadderStep) -> LadderState:
    return LadderState.combine([ActiveStep(s.name, s.action, 0.0, s.remap) for s in steps])


def _step(name: str, action: dict[str, object], pool: str = "flagship") -> LadderStep:
    return LadderStep.model_validate({"name": name, "signal": "queue_depth", "pool": pool, "enter_above": 10,
                                      "exit_below": 5, "action": action})


def test_ladder_raised_threshold_names_the_step_when_it_moves_the_request() -> None:
    state = _state(_step("kv", {"type": "raise_threshold", "threshold": 0.8}))
    d = decide(POLICY, LOADED.version, RouteContext("default", "auto", "hello"), 0.6, state)
    assert (d.pool, d.rule) == ("micro", "ladder:kv")
    assert "raised the threshold 0.5 -> 0.8" in d.reason
    d = decide(POLICY, LOADED.version, RouteContext("default", "auto", "hello"), 0.9, state)
    assert (d.pool, d.rule) == ("flagship", "threshold") and "same pool" in d.reason
    # pool rules and pinned models are not score decisions: the raised threshold does not apply
    assert decide(POLICY, LOADED.version, RouteContext("default", "auto", "SQL"), 0.6, state).pool == "flagship"


def test_ladder_remap_moves_traffic_unless_the_tenant_may_not_use_the_target() -> None:
    state = _state(_step("to-micro", {"type": "fallback_pool", "to_pool": "micro"}))
    d = decide(POLICY, LOADED.version, RouteContext("default", "auto", "hello"), 0.9, state)
    assert (d.pool, d.model, d.rule) == ("micro", "micro", "ladder:to-micro")
    assert "move 'flagship' -> 'micro'" in d.reason
    assert decide(POLICY, LOADED.version, RouteContext("default", "flagship", "x"), None, state).pool == "micro"
    loaded = parse_policy(TENANTS.replace("allowed_pools: [micro, flagship]", "allowed_pools: [flagship]"))
    d = decide(loaded.policy, loaded.version, RouteContext("initech", "auto", "x"), 0.9, state)
    assert d.pool == "flagship" and "may not use" in d.reason


RULE_ONLY = parse_policy(TEXT.replace("  rules:\n", """  rules:
    - {name: vip-gpt4o, match: {models: [gpt-4o], tenants: [vip]}, pool: flagship}
""", 1))


def test_a_rule_only_model_whose_rules_do_not_match_is_not_routed() -> None:
    policy, version = RULE_ONLY.policy, RULE_ONLY.version
    assert decide(policy, version, RouteContext("vip", "gpt-4o", "x"), None).rule == "vip-gpt4o"
    with pytest.raises(ModelNotRouted, match=r"'gpt-4o' is routed only by rules \['vip-gpt4o'\]"):
        decide(policy, version, RouteContext("other", "gpt-4o", "x"), None)
