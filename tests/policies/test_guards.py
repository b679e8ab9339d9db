"""Tenant input guards in the policy: the shapes ops write, and every mistake refused with file:line and a fix."""

from __future__ import annotations

import pytest

from policies.guards import PII_KINDS, Guards
from policies.loader import PolicyError, parse_policy
from tests.conftest import policy_yaml

KEY = "0" * 64  # a well-formed key hash


def _with_guards(guards: str) -> str:
    return policy_yaml("http://127.0.0.1:1", "http://127.0.0.1:2", f"""tenants:
  acme:
    api_key_sha256: ["{KEY}"]
    guards:
{guards}""")


def _guards(text: str) -> Guards:
    return parse_policy(_with_guards(text)).policy.tenants["acme"].guards


def _problems(text: str) -> list[str]:
    with pytest.raises(PolicyError) as err:
        parse_policy(_with_guards(text), "p.yaml")
    return err.value.problems


def _line(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(_with_guards(text).splitlines(), 1) if needle in line)


def test_no_guards_by_default() -> None:
    text = policy_yaml("http://a", "http://b", f"tenants:\n  t: {{api_key_sha256: ['{KEY}']}}\n")
    guards = parse_policy(text).policy.tenants["t"].guards
    assert guards == Guards() and not guards.any


def test_every_guard_in_the_shapes_ops_write() -> None:
    guards = _guards("""      pii: {action: refuse, kinds: [card, iban], phone_regions: [US, DE]}
      max_prompt_chars: 20000
      max_prompt_tokens: 4000
      languages: [en, de]
""")
    assert guards.pii is not None and guards.pii.action == "refuse" and guards.pii.kinds == ("card", "iban")
    assert guards.pii.phone_regions == ("US", "DE")
    assert (guards.max_prompt_chars, guards.max_prompt_tokens) == (20000, 4000)
    assert guards.languages is not None and guards.languages.allowed == ("en", "de")
    assert guards.languages.min_chars == 20 and guards.any


def test_pii_defaults_to_redacting_every_kind() -> None:
    guards = _guards("      pii: {}\n")
    assert guards.pii is not None and guards.pii.action == "redact" and guards.pii.kinds == PII_KINDS


def test_languages_as_a_mapping() -> None:
    guards = _guards("      languages: {allowed: [fr], min_chars: 50}\n")
    assert guards.languages is not None and (guards.languages.allowed, guards.languages.min_chars) == (("fr",), 50)


@pytest.mark.parametrize(("guards", "needle", "path", "says"), [
    ("      pii: {action: redact, kind: [card]}\n", "kind: [card]", "tenants.acme.guards.pii.kind",
     "did you mean `kinds`?"),
    ("      pii: {action: mask}\n", "action: mask", "tenants.acme.guards.pii.action", "'redact' or 'refuse'"),
    ("      pii: {kinds: [card, passport]}\n", "passport", "tenants.acme.guards.pii.kinds[1]", "'email'"),
    ("      pii: {kinds: []}\n", "kinds: []", "tenants.acme.guards.pii.kinds", "at least 1"),
    ("      pii: {phone_regions: [USA]}\n", "USA", "tenants.acme.guards.pii.phone_regions",
     "unknown phone region(s) ['USA']"),
    ("      max_prompt_chars: 0\n", "max_prompt_chars", "tenants.acme.guards.max_prompt_chars",
     "greater than or equal to 1"),
    ("      max_prompt_char: 100\n", "max_prompt_char", "tenants.acme.guards.max_prompt_char",
     "did you mean `max_prompt_chars`?"),
    ("      languages: [english]\n", "english", "tenants.acme.guards.languages.allowed",
     "unknown language code(s) ['english']"),
    ("      languages: []\n", "languages: []", "tenants.acme.guards.languages.allowed", "at least 1"),
    ("      langauges: [en]\n", "langauges", "tenants.acme.guards.langauges", "did you mean `languages`?"),
])
def test_mistakes_name_file_line_path_and_fix(guards: str, needle: str, path: str, says: str) -> None:
    (problem,) = _problems(guards)
    assert problem.startswith(f"p.yaml:{_line(guards, needle)}: {path}"), problem
    assert says in problem, problem
