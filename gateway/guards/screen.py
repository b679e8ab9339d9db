"""A tenant's input guards applied to one chat body, before admission and routing: size, then language, then PII.

`InputGuard.screen` returns the body the rest of the gateway (router, engine, replay log, learning loop) is to see:
the client's own when nothing was redacted, else a copy whose message text carries `[REDACTED:<kind>]` where each
match was. A refusal is an `InputRefused` (400, its code naming the guard). Every decision is reported to the
`on_decision` hook (the metrics) and named in the `x-cascade-guard` header, e.g.
``size=passed; language=passed:en; pii=redacted:card,email``. Neither holds prompt text, nor does the log.

A guard that throws is skipped, its decision `error` (counted, and logged with the exception's type only: its
message might quote the text): the request is served without that guard, never refused or failed for it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from gateway.errors import InputRefused
from gateway.guards.language import detect_language
from gateway.guards.messages import message_texts, rewrite_texts, user_text
from gateway.guards.pii import find_pii, redact
from gateway.guards.size import oversize
from gateway.serving.openai.schema import ChatMessage, ChatRequest
from policies.guards import PII_KINDS, Guards, PiiGuard
from policies.schema import Policy

__all__ = ["GUARD_HEADER", "Decision", "DecisionHook", "InputGuard", "Screened"]

log = logging.getLogger("cascade.guards")
GUARD_HEADER = "x-cascade-guard"
LANGUAGE_CHARS = 2000
GuardName = Literal["size", "language", "pii"]
_REFUSAL_CODES = {"size": "prompt_too_large", "language": "language_not_allowed", "pii": "pii_detected"}


@dataclass(frozen=True, slots=True)
class Decision:
    """What one guard decided. `kinds`: the PII kinds found, the size bound passed, or the language detected.
    `reason`: for a refusal, the client's message (figures and kinds, no prompt text)."""

    guard: GuardName
    action: Literal["passed", "redacted", "refused", "error"]
    kinds: tuple[str, ...] = ()
    reason: str = ""

    def named(self) -> str:
        return f"{self.guard}={self.action}" + (":" + ",".join(self.kinds) if self.kinds else "")


DecisionHook = Callable[[str, str, str, str], None]
"""(tenant, guard, kind, action) of every guard that ran on a request, once per kind found ("none" if none)."""


@dataclass(frozen=True, slots=True)
class Screened:
    """The request as the gateway is to serve it, and the guards' decisions (empty: the tenant has none)."""

    request: ChatRequest
    raw: dict[str, Any]
    decisions: tuple[Decision, ...] = ()

    @property
    def headers(self) -> dict[str, str]:
        return {GUARD_HEADER: _header(self.decisions)} if self.decisions else {}


def _header(decisions: tuple[Decision, ...] | list[Decision]) -> str:
    return "; ".join(d.named() for d in decisions)


class InputGuard:
    """Applies the tenant's `guards` policy. Stateless apart from the hook it reports to."""

    def __init__(self, on_decision: DecisionHook) -> None:
        self._on_decision = on_decision

    def screen(self, policy: Policy, tenant: str, request: ChatRequest, raw: dict[str, Any]) -> Screened:
        """The request to serve (redacted where the tenant's PII guard says so). Raises `InputRefused`."""
        config = policy.tenants.get(tenant)
        guards = config.guards if config is not None else None
        if guards is None or not guards.any:
            return Screened(request, raw)
        decisions: list[Decision] = []
        messages = raw["messages"]
        redacted: list[_Redacted] = []
        steps: tuple[tuple[GuardName, Callable[[], Decision | None]], ...] = (
            ("size", lambda: _size(messages, guards)),
            ("language", lambda: _language(messages, guards)),
            ("pii", lambda: _pii(messages, guards.pii, redacted)),
        )
        try:
            for name, step in steps:
                decision = _safely(name, step)
                if decision is not None:
                    decisions.append(decision)
                    _refuse_if(decision, decisions)
        finally:
            for decision in decisions:
                self._report(tenant, decision)
        if redacted:
            raw = {**raw, "messages": redacted[0][0]}
            request = request.model_copy(update={"messages": redacted[0][1]})
        return Screened(request, raw, tuple(decisions))

    def _report(self, tenant: str, decision: Decision) -> None:
        for kind in decision.kinds or ("none",):
            self._on_decision(tenant, decision.guard, kind, decision.action)


def _refuse_if(decision: Decision, decisions: list[Decision]) -> None:
    if decision.action == "refused":
        raise InputRefused(decision.reason, _REFUSAL_CODES[decision.guard], _header(decisions))


def _safely(guard: GuardName, run: Callable[[], Decision | None]) -> Decision | None:
    try:
        return run()
    except Exception as exc:  # a guard's bug or a library's refusal of odd input must not fail the request
        log.warning("input guard %s failed (%s); the request is served without it", guard, type(exc).__name__)
        return Decision(guard, "error")


def _size(messages: Any, guards: Guards) -> Decision | None:
    if guards.max_prompt_chars is None and guards.max_prompt_tokens is None:
        return None
    over = oversize(messages, guards)
    return Decision("size", "passed") if over is None else Decision("size", "refused", (over[0],), over[1])


def _language(messages: Any, guards: Guards) -> Decision | None:
    if guards.languages is None:
        return None
    allowed = guards.languages.allowed
    found = detect_language(user_text(messages, LANGUAGE_CHARS), guards.languages.min_chars)
    if found is None or found in allowed:
        return Decision("language", "passed", (found,) if found else ())
    return Decision("language", "refused", (found,), f"the prompt is written in {found!r}; this tenant accepts "
                    f"{', '.join(allowed)}")


_Redacted = tuple[list[Any], list[ChatMessage]]
"""Redacted messages: as the engine is to see them, and validated (`ChatRequest.messages`)."""


def _pii(messages: Any, guard: PiiGuard | None, outcome: list[_Redacted]) -> Decision | None:
    """The PII decision; for a redaction, the redacted messages appended to `outcome` (checked: they must still
    be valid messages, else the guard has failed)."""
    if guard is None:
        return None
    found: set[str] = set()
    if guard.action == "refuse":
        for text in message_texts(messages):
            found.update(span.kind for span in find_pii(text, guard))
        kinds = tuple(k for k in PII_KINDS if k in found)
        if not kinds:
            return Decision("pii", "passed")
        return Decision("pii", "refused", kinds, f"the prompt holds personal data or secrets ({', '.join(kinds)}); "
                        "this tenant refuses such prompts: remove them and retry")

    def rewrite(text: str) -> str:
        spans = find_pii(text, guard)
        found.update(span.kind for span in spans)
        return redact(text, spans) if spans else text

    redacted = rewrite_texts(messages, rewrite) if isinstance(messages, list) else None
    if redacted is None:
        return Decision("pii", "passed")
    outcome.append((redacted, [ChatMessage.model_validate(m) for m in redacted]))
    return Decision("pii", "redacted", tuple(k for k in PII_KINDS if k in found))
