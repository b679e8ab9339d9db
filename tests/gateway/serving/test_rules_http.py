"""Every rule kind through the gateway (in-process, `tests.harness`, over fake engines): the rule that fires is in the
headers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.api.auth import hash_key
from gateway.settings import Settings
from loadtest.fake_upstream import FakeUpstream
from tests.conftest import policy_yaml
from tests.harness import FakeEngines, InProcessGateway

RULES = f"""  rules:
    - {{name: by-tenant, match: {{tenants: [vip]}}, pool: flagship}}
    - {{name: by-alias, match: {{models: [smart]}}, pool: flagship}}
    - {{name: by-foreign-name, match: {{models: [gpt-4o]}}, pool: micro}}
    - {{name: by-metadata, match: {{metadata: {{team: [research]}}}}, pool: flagship}}
    - {{name: by-header, match: {{headers: {{x-priority: "^urgent$"}}}}, pool: flagship}}
    - {{name: by-tools, match: {{has_tools: true}}, pool: flagship}}
    - {{name: by-json, match: {{json_response: true}}, pool: micro}}
    - {{name: by-keyword, match: {{keywords: [kubernetes]}}, pool: flagship}}
    - {{name: by-regex, match: {{regex: ["\\\\bSELECT\\\\b.+\\\\bFROM\\\\b"]}}, pool: flagship}}
    - {{name: by-length, match: {{min_prompt_tokens: 400}}, pool: flagship}}
    - {{name: by-score, match: {{min_score: 0.2, max_score: 0.4}}, threshold: 0.3}}
aliases:
  smart: micro
tenants:
  vip: {{api_key_sha256: ['{hash_key("sk-vip")}']}}
  std: {{api_key_sha256: ['{hash_key("sk-std")}']}}
"""


def serve_with_rules(tmp: Path, rules: str) -> Iterator[httpx.Client]:
    """A client of a gateway in-process (length scorer, memory ledger) over two fake engines, with `rules` after the
    threshold."""
    engines = FakeEngines()
    micro, flagship = (engines.add(name, FakeUpstream(f"{name}-model")) for name in ("micro", "flagship"))
    path = tmp / "policy.yaml"
    path.write_text(policy_yaml(micro, flagship).replace("  threshold: 0.5\n", "  threshold: 0.5\n" + rules))
    settings = Settings(policy_path=path, scorer="length", start_engines=False, ledger="memory", home=tmp)
    with InProcessGateway(settings, engines) as gateway:
        yield gateway.client


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    yield from serve_with_rules(tmp_path_factory.mktemp("rules"), RULES)


def _msg(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


CASES: list[tuple[str, dict[str, Any], dict[str, str], str, str]] = [
    ("tenant", {}, {"authorization": "Bearer sk-vip"}, "flagship", "by-tenant"),
    ("alias", {"model": "smart"}, {}, "flagship", "by-alias"),  # a model rule comes before the alias
    ("rule-model", {"model": "gpt-4o"}, {}, "micro", "by-foreign-name"),  # a name only a rule knows
    ("metadata", {"metadata": {"team": "research"}}, {}, "flagship", "by-metadata"),
    ("header", {}, {"x-priority": "urgent"}, "flagship", "by-header"),
    ("tools", {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, {}, "flagship",
     "by-tools"),
    ("json", {"response_format": {"type": "json_object"}}, {}, "micro", "by-json"),
    ("keyword", {"messages": _msg("deploy this on Kubernetes")}, {}, "flagship", "by-keyword"),
    ("regex", {"messages": _msg("SELECT name FROM users")}, {}, "flagship", "by-regex"),
    ("length", {"messages": _msg("x " * 900)}, {}, "flagship", "by-length"),
    ("score", {"messages": _msg("w " * 70)}, {}, "flagship", "by-score"),  # length score 0.35 >= 0.3
    ("none", {}, {}, "micro", "threshold"),
]


@pytest.mark.parametrize(("kind", "body", "headers", "pool", "rule"), CASES, ids=[c[0] for c in CASES])
def test_rule_kind(gateway: httpx.Client, kind: str, body: dict[str, Any], headers: dict[str, str], pool: str,
                   rule: str) -> None:
    payload = {"model": "auto", "messages": _msg("hello"), **body}
    auth = headers if "authorization" in headers else {**headers, "authorization": "Bearer sk-std"}
    r = gateway.post("/v1/chat/completions", json=payload, headers=auth)
    assert r.status_code == 200, r.text
    assert (r.headers["x-cascade-pool"], r.headers["x-cascade-rule"]) == (pool, rule)
