"""One engine call of a request, as the sending layers pass it down (`Layer`, `gateway.serving.sending.layers`), and how
a call is made ready for a decision: the engine's body with the completion limit the gateway sets on it, and, for a
second call of the same request (an escalation, an output check's resend), its hold against the tenant's budget.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Protocol

from backends.clients.pool import Pool
from gateway.serving.openai.endpoints import native_upstream
from gateway.serving.openai.upstream import prepare_upstream
from gateway.serving.records.accounting import RequestFacts
from gateway.serving.routing.completion_limit import CompletionLimits, held_completion
from gateway.serving.routing.request_context import RequestContext
from gateway.serving.sending.forwarding import JSONReply, StreamReply
from gateway.tenancy.admission import Admission
from policies.decide import RouteDecision

__all__ = ["Call", "Calls", "Layer"]


@dataclass(frozen=True, slots=True)
class Call:
    """`facts.decision` says where the call goes; `upstream` is the engine's body for it; `headers` are the response
    headers it adds (the ladder's, the cascade's); `pool` is the engine version's replicas, set by the canary layer
    (`gateway.serving.sending.layers.CanaryLayer`) for the layers below it."""

    facts: RequestFacts
    upstream: dict[str, Any]
    headers: dict[str, str]
    pool: Pool | None = None

    @property
    def decision(self) -> RouteDecision:
        return self.facts.decision


class Layer(Protocol):
    """One sending layer (`gateway.serving.sending.layers`): it wraps the next and sends a call through it."""

    async def send(self, ctx: RequestContext, call: Call) -> JSONReply | StreamReply:
        """The reply to `call`; raises `NoReplicaAvailable` or `UpstreamError` where no engine answered it before
        any byte, and the error tree's other errors for a request an engine refused (its 4xx)."""
        ...


class Calls:
    """Makes calls ready. Shares, does not own, the completion limits and admission."""

    def __init__(self, limits: CompletionLimits, admission: Admission) -> None:
        self._limits = limits
        self._admission = admission

    async def prepare(self, ctx: RequestContext, facts: RequestFacts, decision: RouteDecision) -> Call:
        """The call of `decision`: the engine's body (the chat body, or the native body of a Responses or
        completions request) with the gateway's completion limit (`gateway.serving.routing.completion_limit`), the
        ladder's response headers, and `facts` with the decision and that limit."""
        if ctx.native is None:
            upstream, headers = prepare_upstream(ctx.raw, decision, ctx.request, ctx.ladder)
        else:
            upstream, headers = native_upstream(ctx.native, decision, ctx.request.stream, ctx.ladder)
        upstream, limit = await self._limits.apply(ctx.loaded, decision.pool, ctx.request.completion_limit, upstream,
                                                   ctx.endpoint.name)
        return Call(replace(facts, decision=decision, limit_set=limit), upstream, headers)

    async def hold_again(self, ctx: RequestContext, call: Call) -> bool:
        """Hold a second engine call of the request (`call`, prepared) before it is made (`Admission.hold_again`):
        its prompt and completion limit on its pool. False when the tenant's budget cannot carry it."""
        pool = call.decision.pool
        completion = call.facts.limit_set.tokens or held_completion(ctx.loaded.policy, pool,
                                                                    ctx.request.completion_limit)
        return await self._admission.hold_again(ctx.loaded.policy, ctx.tenant, ctx.request_id, pool,
                                                ctx.raw["messages"], completion * ctx.request.n)

    async def give_back_hold(self, ctx: RequestContext) -> None:
        """The request's budget holds go back now: nothing will record its id."""
        await self._admission.give_back_hold(ctx.request_id)
