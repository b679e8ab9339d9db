"""The size of a prompt as the size guard measures it: characters of message text, and tokens estimated as the
rate limiter estimates them (`policies.context`: a quarter of the characters). Pure."""

from __future__ import annotations

from typing import Any

from policies.context import estimate_tokens, prompt_text_of
from policies.guards import Guards

__all__ = ["oversize"]


def oversize(messages: Any, guards: Guards) -> tuple[str, str] | None:
    """(the bound passed: "chars" or "tokens", a message naming both figures), or None when within the bounds."""
    text = prompt_text_of(messages)
    if guards.max_prompt_chars is not None and len(text) > guards.max_prompt_chars:
        return "chars", (f"the prompt has {len(text)} characters of text; this tenant's limit is "
                         f"{guards.max_prompt_chars}")
    tokens = estimate_tokens(text)
    if guards.max_prompt_tokens is not None and tokens > guards.max_prompt_tokens:
        return "tokens", (f"the prompt has about {tokens} tokens (characters / 4); this tenant's limit is "
                          f"{guards.max_prompt_tokens}")
    return None
