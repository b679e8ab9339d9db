"""Routing decisions: pinned models, rules, thresholds (global, tenant, rule), no score."""

from __future__ import annotations

from pathlib import Path

from policies.decide import RouteContext, decide, needs_score, pinned_pool
from policies.loader import parse_policy

ROOT = Path(__file__).resolve().parents[2]
TEXT = (ROOT / "policies" / "default.yaml").read_text().replace("threshold: 0.5", """threshold: 0.5
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
