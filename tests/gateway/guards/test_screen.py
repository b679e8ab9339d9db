"""`InputGuard.screen`: the body the rest of the gateway sees, the refusals, the decisions reported and named."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.errors import InputRefused
from gateway.guards import screen as screen_module
from gateway.guards.screen import InputGuard
from gateway.serving.openai.schema import ChatRequest
from policies.guards import Guards, LanguageGuard, PiiGuard
from policies.schema import Policy

CARD = "4111 1111 1111 1111"
GERMAN = "Guten Tag, ich möchte bitte wissen, wie das Wetter morgen in Berlin wird und ob es regnet."
_POOL = {"type": "remote", "urls": ["http://127.0.0.1:1"], "model": "m",
         "price": {"input_per_mtok": "0", "output_per_mtok": "0"}}


def _policy(guards: Guards) -> Policy:
    return Policy.model_validate({"pools": {"a": _POOL}, "routing": {"micro_pool": "a", "flagship_pool": "a"},
                                  "tenants": {"t": {"guards": guards.model_dump(exclude_none=True)},
                                              "plain": {}}})


def _body(*messages: dict[str, Any]) -> tuple[ChatRequest, dict[str, Any]]:
    raw: dict[str, Any] = {"model": "auto", "messages": list(messages)}
    return ChatRequest.model_validate(raw), raw


class Decisions:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str, str]] = []

    def __call__(self, tenant: str, guard: str, kind: str, action: str) -> None:
        self.seen.append((tenant, guard, kind, action))


def test_redaction_rewrites_string_and_part_content_and_leaves_the_client_body_alone() -> None:
    hook = Decisions()
    request, raw = _body(
        {"role": "system", "content": "Support bot. Escalations: ops@example.com"},
        {"role": "user", "content": [{"type": "text", "text": f"my card is {CARD}"},
                                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "type": "function",
                                                               "function": {"name": "f", "arguments": "{}"}}]},
    )
    screened = InputGuard(hook).screen(_policy(Guards(pii=PiiGuard())), "t", request, raw)
    messages = screened.raw["messages"]
    assert messages[0]["content"] == "Support bot. Escalations: [REDACTED:email]"
    assert messages[1]["content"][0] == {"type": "text", "text": "my card is [REDACTED:card]"}
    assert messages[1]["content"][1] is raw["messages"][1]["content"][1]  # non-text parts untouched
    assert messages[2] is raw["messages"][2]
    assert raw["messages"][1]["content"][0]["text"] == f"my card is {CARD}"  # the client's body is not modified
    assert screened.request.messages[1].content == messages[1]["content"]  # the typed view agrees
    assert screened.headers == {"x-cascade-guard": "pii=redacted:email,card"}
    assert hook.seen == [("t", "pii", "email", "redacted"), ("t", "pii", "card", "redacted")]


def test_nothing_found_passes_the_same_body() -> None:
    hook = Decisions()
    request, raw = _body({"role": "user", "content": "order 2125551234 shipped on 2024-06-12"})
    screened = InputGuard(hook).screen(_policy(Guards(pii=PiiGuard())), "t", request, raw)
    assert screened.raw is raw and screened.request is request
    assert screened.headers == {"x-cascade-guard": "pii=passed"}
    assert hook.seen == [("t", "pii", "none", "passed")]


def test_a_tenant_without_guards_is_not_screened() -> None:
    hook = Decisions()
    request, raw = _body({"role": "user", "content": f"card {CARD}"})
    screened = InputGuard(hook).screen(_policy(Guards(pii=PiiGuard())), "plain", request, raw)
    assert screened.raw is raw and screened.headers == {} and hook.seen == []
    unknown = InputGuard(hook).screen(_policy(Guards(pii=PiiGuard())), "default", request, raw)
    assert unknown.raw is raw and hook.seen == []


def test_refusal_names_the_kinds_never_the_text() -> None:
    hook = Decisions()
    request, raw = _body({"role": "user", "content": f"card {CARD}, key AKIAIOSFODNN7EXAMPLE"})
    with pytest.raises(InputRefused) as err:
        InputGuard(hook).screen(_policy(Guards(pii=PiiGuard(action="refuse"))), "t", request, raw)
    exc = err.value
    assert (exc.status, exc.code, exc.param) == (400, "pii_detected", "messages")
    assert "card, secret" in exc.message
    assert CARD not in exc.message and "AKIA" not in exc.message and CARD.encode() not in exc.body()
    assert exc.headers() == {"x-cascade-guard": "pii=refused:card,secret"}
    assert hook.seen == [("t", "pii", "card", "refused"), ("t", "pii", "secret", "refused")]


def test_size_is_checked_first_and_stops_the_rest() -> None:
    hook = Decisions()
    request, raw = _body({"role": "user", "content": f"{CARD} " + "x" * 100})
    guards = Guards(pii=PiiGuard(action="refuse"), max_prompt_chars=50)
    with pytest.raises(InputRefused) as err:
        InputGuard(hook).screen(_policy(guards), "t", request, raw)
    assert err.value.code == "prompt_too_large" and "120 characters" in err.value.message
    assert hook.seen == [("t", "size", "chars", "refused")]
    with pytest.raises(InputRefused) as err:
        InputGuard(hook).screen(_policy(Guards(max_prompt_tokens=10)), "t", request, raw)
    assert err.value.code == "prompt_too_large" and "about 30 tokens" in err.value.message


def test_language_guard_refuses_a_reliable_other_language_and_lets_doubt_through() -> None:
    hook = Decisions()
    guards = Guards(languages=LanguageGuard(allowed=("en",)))
    with pytest.raises(InputRefused) as err:
        InputGuard(hook).screen(_policy(guards), "t", *_body({"role": "user", "content": GERMAN}))
    assert err.value.code == "language_not_allowed" and "'de'" in err.value.message
    assert err.value.headers() == {"x-cascade-guard": "language=refused:de"}
    short = InputGuard(hook).screen(_policy(guards), "t", *_body({"role": "user", "content": "Danke!"}))
    assert short.headers == {"x-cascade-guard": "language=passed"}  # too short to tell
    english = "Could you tell me what the weather will be like in Berlin tomorrow, and whether it will rain?"
    passed = InputGuard(hook).screen(_policy(guards), "t", *_body({"role": "system", "content": GERMAN},
                                                                  {"role": "user", "content": english}))
    assert passed.headers == {"x-cascade-guard": "language=passed:en"}  # judged on the user turns
    assert hook.seen[-2:] == [("t", "language", "none", "passed"), ("t", "language", "en", "passed")]


def test_every_guard_named_in_order() -> None:
    guards = Guards(pii=PiiGuard(), max_prompt_chars=1000, languages=LanguageGuard(allowed=("en",)))
    text = f"Please charge my card {CARD} for the order we discussed on the phone yesterday."
    screened = InputGuard(Decisions()).screen(_policy(guards), "t", *_body({"role": "user", "content": text}))
    assert screened.headers == {"x-cascade-guard": "size=passed; language=passed:en; pii=redacted:card"}


def test_a_guard_that_throws_is_skipped_and_counted(monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    def broken(text: str, guard: PiiGuard) -> list[Any]:
        raise RuntimeError(f"cannot parse {text}")

    monkeypatch.setattr(screen_module, "find_pii", broken)
    hook = Decisions()
    request, raw = _body({"role": "user", "content": f"card {CARD}"})
    guards = Guards(pii=PiiGuard(action="refuse"), max_prompt_chars=1000)
    screened = InputGuard(hook).screen(_policy(guards), "t", request, raw)
    assert screened.raw is raw  # served, as sent
    assert screened.headers == {"x-cascade-guard": "size=passed; pii=error"}
    assert hook.seen == [("t", "size", "none", "passed"), ("t", "pii", "none", "error")]
    assert "RuntimeError" in caplog.text and CARD not in caplog.text  # the exception's message is not logged
