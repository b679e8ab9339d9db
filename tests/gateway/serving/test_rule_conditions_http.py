"""Rule conditions that `test_rules_http` leaves out, through the gateway (in-process): prompt size bounds in chars and
tokens (upper bounds included), negated tools / JSON conditions, AND of several conditions, and a model
name only rules know whose rules do not match the request."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.api.auth import hash_key
from tests.gateway.serving.test_rules_http import serve_with_rules

RULES = f"""  rules:
    - {{name: vip-gpt4o, match: {{models: [gpt-4o], tenants: [vip]}}, pool: flagship}}
    - {{name: huge-chars, match: {{min_prompt_chars: 3000}}, pool: flagship}}
    - {{name: tiny-chars, match: {{max_prompt_chars: 3}}, pool: flagship}}
    - {{name: few-tokens-json, match: {{max_prompt_tokens: 10, json_response: true}}, pool: flagship}}
    - {{name: no-tools-mid, match: {{has_tools: false, min_prompt_tokens: 100, max_prompt_tokens: 120}},
       pool: flagship}}
    - {{name: vip-json-free, match: {{tenants: [vip], json_response: false, keywords: [audit]}}, pool: micro}}
tenants:
  vip: {{api_key_sha256: ['{hash_key("sk-vip")}']}}
  std: {{api_key_sha256: ['{hash_key("sk-std")}']}}
"""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    yield from serve_with_rules(tmp_path_factory.mktemp("audit-rules"), RULES)


def _post(gateway: httpx.Client, key: str, **body: Any) -> httpx.Response:
    payload = {"model": "auto", "messages": [{"role": "user", "content": "hello"}], **body}
    return gateway.post("/v1/chat/completions", json=payload, headers={"authorization": f"Bearer {key}"})


def _msg(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


AUDIT = _msg("an audit of these accounts, please, before the end of the quarter")  # 17 tokens, short score
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
JSON = {"type": "json_object"}
CASES: list[tuple[str, str, dict[str, Any], str, str]] = [
    ("min-chars", "sk-std", {"messages": _msg("x" * 3000)}, "flagship", "huge-chars"),
    ("max-chars", "sk-std", {"messages": _msg("hi")}, "flagship", "tiny-chars"),
    ("max-tokens-and-json", "sk-std", {"response_format": JSON}, "flagship", "few-tokens-json"),
    ("json-but-too-long", "sk-std", {"messages": _msg("y" * 60), "response_format": JSON}, "micro", "threshold"),
    ("no-tools-in-range", "sk-std", {"messages": _msg("z" * 440)}, "flagship", "no-tools-mid"),
    ("tools-in-range", "sk-std", {"messages": _msg("z" * 440), "tools": TOOLS}, "micro", "threshold"),
    ("all-conditions", "sk-vip", {"messages": AUDIT}, "micro", "vip-json-free"),
    ("one-condition-fails", "sk-vip", {"messages": AUDIT, "response_format": JSON}, "micro",
     "threshold"),
    ("rule-only-model", "sk-vip", {"model": "gpt-4o"}, "flagship", "vip-gpt4o"),
]


@pytest.mark.parametrize(("key", "body", "pool", "rule"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_rule_condition(gateway: httpx.Client, key: str, body: dict[str, Any], pool: str, rule: str) -> None:
    r = _post(gateway, key, **body)
    assert r.status_code == 200, r.text
    assert (r.headers["x-cascade-pool"], r.headers["x-cascade-rule"]) == (pool, rule)


def test_a_rule_only_model_none_of_whose_rules_match_is_a_404(gateway: httpx.Client) -> None:
    r = _post(gateway, "sk-std", model="gpt-4o")
    assert r.status_code == 404, r.text
    assert r.json()["error"]["param"] == "model" and "vip-gpt4o" in r.json()["error"]["message"]
