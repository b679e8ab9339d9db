"""Conversation length as a routing input: a request goes to a pool whose context holds its prompt and its
completion limit, or gets a 400 naming the sizes; never an engine 400 for a request the gateway could have placed.

How it is decided, after the router chose a pool and before anything is sent:
- The room a request needs is its prompt's tokens plus its completion limit (`max_tokens`, or 1 where the client set
  none: vLLM then writes until the context is full). A pool's context is its engine's `max_model_len` (local) or its
  `context_tokens` (remote; unset: not checked).
- Fast path, no counting: the JSON size of the request body in bytes is an upper bound of its prompt's tokens (every
  token of a byte-level BPE or byte-fallback tokenizer covers at least one byte of the text, and the JSON framing of
  each message outweighs its chat-template tokens), plus `TEMPLATE_MARGIN` for what a chat template adds of its own
  (a default system prompt). A request within that bound fits: nearly all traffic costs one `orjson.dumps`.
- Otherwise the prompt is counted as usage is (`gateway.serving.openai.prompt_count`: the engine's own `/tokenize` for a
  local pool, the pool's tokenizer or an estimate for a remote one), on the pool it is checked against.
- A request that does not fit its pool moves to the other tier (with `routing.tiers`: the first of the next tier
  up, the next down, then further out, `policies.tenant_moves.other_tiers`) where that one holds it and the tenant
  may be moved there (`policies.tenant_moves`: allowed pools, budget downgrade, shedding); rule `context-fit`. A
  pinned model is never swapped (its caller asked for that model). A chat request on a pool whose ladder truncates
  context (`truncate_context`, `policies.truncate`) fits when the truncated prompt does. Else: 400
  `context_length_exceeded`, naming the prompt's size, the completion limit and each pool's context.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from backends.clients.pool import Pool
from backends.clients.shared import EngineClient
from gateway.errors import BadRequest
from gateway.serving.openai.endpoints import COMPLETIONS, RESPONSES, NativeBody, endpoint_of
from gateway.serving.openai.prompt_count import count_request_usage
from gateway.serving.openai.schema import ChatRequest
from policies.decide import RouteDecision, moved, served_model
from policies.ladder import LadderState
from policies.loader import LoadedPolicy
from policies.pools import LocalPool, RemotePool, context_of
from policies.tenant_moves import other_tiers

__all__ = ["TEMPLATE_MARGIN", "ContextFit", "Need", "context_of"]

log = logging.getLogger("cascade.context")

TEMPLATE_MARGIN = 128
"""Tokens a chat template may add beyond the messages' JSON bytes (a default system prompt, role markers)."""


@dataclass(frozen=True, slots=True)
class Need:
    """What one request needs of a context: `bound`, an upper bound of its prompt's tokens (no counting), and its
    completion limit `completion` (the client's, else 1). `field` names the client's completion-limit field."""

    bound: int
    completion: int
    field: str | None

    @classmethod
    def of(cls, request: ChatRequest, raw: dict[str, Any], native: NativeBody | None) -> Need:
        body = raw if native is None else native.body
        limit = request.completion_limit
        field = None
        if limit is not None:
            field = "max_completion_tokens" if request.max_completion_tokens else "max_tokens"
            if native is not None and native.endpoint is RESPONSES:
                field = "max_output_tokens"
        return cls(len(orjson.dumps(body)) + TEMPLATE_MARGIN, limit or 1, field)


class ContextFit:
    """Places requests by conversation length. Shares, does not own, the engine client and the pools."""

    def __init__(self, engines: EngineClient, pools: Callable[[str], Pool | None]) -> None:
        """`pools(name)`: the running replicas of pool `name` (None: not running), where a prompt is counted."""
        self._engines = engines
        self._pools = pools

    async def _prompt_tokens(self, loaded: LoadedPolicy, pool: str, raw: dict[str, Any],
                             native: NativeBody | None) -> int:
        """The prompt's tokens as `pool` counts them: at a healthy replica of a local pool, on this machine for a
        remote one, estimated for a local pool with no replica answering (`count_request_usage`)."""
        body = raw if native is None else native.body
        return (await self._count(loaded, pool, body, endpoint_of(native).name))[0]

    async def _count(self, loaded: LoadedPolicy, pool: str, body: dict[str, Any], endpoint: str) -> tuple[int, bool]:
        """(the prompt's tokens in `body` as `pool` counts them, whether that was an estimate)."""
        spec: LocalPool | RemotePool | None = loaded.policy.pools[pool]
        replicas = self._pools(pool)
        url = next((r.url for r in replicas.replicas if r.healthy), "") if replicas is not None else ""
        if isinstance(spec, LocalPool) and not url:
            spec = None  # nothing to count at: estimated
        counted = await count_request_usage(endpoint, spec, self._engines, url, served_model(loaded.policy, pool),
                                            body, "")
        return counted.prompt_tokens, counted.source == "estimate"

    async def prompt_bound(self, loaded: LoadedPolicy, pool: str, body: dict[str, Any], endpoint: str,
                           count: bool) -> int:
        """An upper bound of the prompt's tokens in the engine body `body` on `pool`: its JSON size plus
        `TEMPLATE_MARGIN` (no counting), or with `count` its tokens counted as `pool` counts them where that is
        not an estimate (4 characters a token may undercount), whichever is smaller."""
        bound = len(orjson.dumps(body)) + TEMPLATE_MARGIN
        if not count:
            return bound
        tokens, estimated = await self._count(loaded, pool, body, endpoint)
        return bound if estimated else min(bound, tokens)

    async def fits(self, loaded: LoadedPolicy, pool: str, need: Need, raw: dict[str, Any],
                   native: NativeBody | None, ladder: LadderState) -> tuple[bool, int | None]:
        """Whether the request fits `pool`'s context, and its prompt's counted tokens (None: not counted, the
        bound showed it fits or the pool's context is not known)."""
        context = context_of(loaded.policy.pools[pool])
        if context is None or need.bound + need.completion <= context:
            return True, None
        if need.completion >= context:
            return False, None  # no prompt fits beside it: nothing to count
        tokens = await self._prompt_tokens(loaded, pool, raw, native)
        truncate = ladder.applying_to(pool).truncate_tokens if endpoint_of(native).truncation else None
        if truncate is not None:
            tokens = min(tokens, truncate)
        return tokens + need.completion <= context, tokens

    async def place(self, loaded: LoadedPolicy, decision: RouteDecision, request: ChatRequest, raw: dict[str, Any],
                    native: NativeBody | None, tenant: str, ladder: LadderState, downgrade: bool) -> RouteDecision:
        """`decision`, or the same request on the other tier whose context holds it; raises `BadRequest`
        (`context_length_exceeded`) where none does."""
        need = Need.of(request, raw, native)
        fits, tokens = await self.fits(loaded, decision.pool, need, raw, native, ladder)
        if fits:
            return decision
        sizes = {decision.pool: tokens}
        for other in other_tiers(loaded.policy, decision, tenant, ladder, downgrade):
            fits, sizes[other] = await self.fits(loaded, other, need, raw, native, ladder)
            if fits:
                why = (f"{_size(tokens, need)} does not fit {decision.pool!r} (context "
                       f"{context_of(loaded.policy.pools[decision.pool])} tokens): routed to {other!r} (context "
                       f"{context_of(loaded.policy.pools[other])} tokens)")
                log.info("request moved by its length: %s", why)
                short = (f"{_size(tokens, need)} does not fit {decision.pool!r} "
                         f"({context_of(loaded.policy.pools[decision.pool])} tokens)")
                return moved(loaded.policy, decision, "context-fit", other, short, why)
        raise _too_long(loaded, sizes, need, decision, native)


def _size(tokens: int | None, need: Need) -> str:
    prompt = f"a prompt of {tokens} tokens" if tokens is not None else "the prompt"
    if need.field is None:
        return f"{prompt} and at least 1 completion token"
    return f"{prompt} and {need.field}={need.completion}"


def _too_long(loaded: LoadedPolicy, sizes: dict[str, int | None], need: Need, decision: RouteDecision,
              native: NativeBody | None) -> BadRequest:
    pools = ", ".join(f"{name!r} holds {context_of(loaded.policy.pools[name])} tokens" for name in sizes)
    tokens = next((t for t in sizes.values() if t is not None), None)
    pinned = " (the model was pinned: no other pool is tried)" if decision.rule == "pinned" else ""
    if tokens is None and need.field is not None:  # the completion limit alone is too large
        param = need.field
    else:
        param = {RESPONSES.name: "input", COMPLETIONS.name: "prompt"}.get(
            endpoint_of(native).name, "messages")
    return BadRequest(f"{_size(tokens, need)} do not fit in any pool that may serve this request: {pools}, prompt "
                      f"and completion together{pinned}", param=param, code="context_length_exceeded")
