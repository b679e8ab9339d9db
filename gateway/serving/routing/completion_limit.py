"""The completion limit of every engine call: the client's, or one the gateway sets, so that what a tenant's budget
holds is what the request can really cost.

A request without a limit (`max_tokens`, `max_completion_tokens`, `max_output_tokens`) would let the engine write
until its context is full. The gateway sends each engine call of such a request an explicit limit, per pool:
- the policy's `default_max_tokens` where the context left after the prompt holds it (no counting: the prompt's
  JSON size plus `TEMPLATE_MARGIN` bounds its tokens);
- else the context left after the prompt, counted as context-fit counts it (`ContextFit.prompt_bound`), at most the
  default;
- nothing on a local pool's chat or Responses call without a default whose prompt the JSON-size bound shows fits
  (no counting, no `/tokenize` round trip): vLLM's own limit there is the context left after the prompt, the same
  figure counted; recorded as "engine". A completions call (vLLM's default there is 16 tokens) or a prompt near the
  context is counted as above;
- on a pool whose context is unknown (a remote pool without `context_tokens`): the default, else nothing (the
  engine's own default applies: set `context_tokens` or `default_max_tokens` for a budget to hold the worst case).
Admission holds, before routing, the most any pool may be sent (`held_completion`): the client's limit (after
`CASCADE_MAX_TOKENS_CAP`), else the smaller of the default and the pool's whole context, never less than is sent.
The cost record says what was set (`completion_limit_tokens`, `completion_limit_by`: "default", "context", or
"engine" with 0 tokens where the local engine applies the context left itself).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.serving.openai.endpoints import CHAT, COMPLETIONS, RESPONSES
from gateway.serving.routing.context_fit import ContextFit
from policies.loader import LoadedPolicy
from policies.pools import LocalPool, context_of
from policies.schema import Policy

__all__ = ["ENGINE_LIMIT", "FALLBACK_COMPLETION", "NO_LIMIT_SET", "CompletionLimits", "SetLimit", "held_completion"]

FALLBACK_COMPLETION = 256
"""Tokens held for a request without a limit on a pool whose context is unknown and with no policy default: the
engine decides there, so no hold is a worst case."""

_FIELD = {CHAT.name: "max_completion_tokens", COMPLETIONS.name: "max_tokens", RESPONSES.name: "max_output_tokens"}


@dataclass(frozen=True, slots=True)
class SetLimit:
    """The limit the gateway set on one engine call (tokens per choice) and why: "default" (the policy's) or
    "context" (the context left after the prompt); `tokens` 0 and `by` "engine" where a local engine applies the
    context left itself (nothing sent), `by` "" where the client's own limit applies or none could be set."""

    tokens: int = 0
    by: str = ""


NO_LIMIT_SET = SetLimit()
ENGINE_LIMIT = SetLimit(0, "engine")
_ENGINE_DEFAULTS_TO_CONTEXT = frozenset({CHAT.name, RESPONSES.name})
"""Endpoints whose vLLM default completion limit is the context left after the prompt (completions': 16 tokens)."""


def held_completion(policy: Policy, pool: str, limit: int | None) -> int:
    """The most completion tokens (per choice) one call of a request whose own limit is `limit` may be sent on
    `pool`: what admission holds."""
    if limit is not None:
        return limit
    bounds = [v for v in (policy.default_max_tokens, context_of(policy.pools[pool])) if v is not None]
    return min(bounds) if bounds else FALLBACK_COMPLETION


class CompletionLimits:
    """Sets the limit of engine calls. Shares, does not own, the context-fit step (which counts prompts)."""

    def __init__(self, fit: ContextFit) -> None:
        self._fit = fit

    async def apply(self, loaded: LoadedPolicy, pool: str, limit: int | None, upstream: dict[str, Any],
                    endpoint: str) -> tuple[dict[str, Any], SetLimit]:
        """`upstream` (the engine body of `endpoint` for `pool`) with the gateway's limit where the client's
        `limit` is None, and what was set. Counts the prompt only where the default does not surely fit."""
        if limit is not None:
            return upstream, NO_LIMIT_SET
        default, context = loaded.policy.default_max_tokens, context_of(loaded.policy.pools[pool])
        if context is None:
            chosen = NO_LIMIT_SET if default is None else SetLimit(default, "default")
        else:
            room = context - await self._fit.prompt_bound(loaded, pool, upstream, endpoint, count=False)
            if default is None and room >= 1 and endpoint in _ENGINE_DEFAULTS_TO_CONTEXT and isinstance(
                    loaded.policy.pools[pool], LocalPool):
                return upstream, ENGINE_LIMIT  # the engine stops at the context left: counting it adds nothing
            if default is None or default > room:
                room = context - await self._fit.prompt_bound(loaded, pool, upstream, endpoint, count=True)
            room = max(1, room)  # context-fit placed it: a prompt that leaves no room is an engine's to refuse
            chosen = SetLimit(default, "default") if default is not None and default <= room else (
                SetLimit(room, "context"))
        if not chosen.tokens:
            return upstream, chosen
        return {**upstream, _FIELD[endpoint]: chosen.tokens}, chosen
