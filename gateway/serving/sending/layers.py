"""Sending a planned request, as layers: each wraps the next and has one method, `send(context, call) -> reply`.

From the outside in (`sending_stack`):

- cache (`CacheLayer`): answers from the tenant's response cache, or sends on and keeps the answer;
- output check (`gateway.serving.sending.answer_check.OutputCheckLayer`): an answer a check replaces is sent again,
  once;
- failover (`FailoverLayer`): a pool that could not answer before any byte hands the request to the next tier;
- canary (`CanaryLayer`): the pool's version that takes the request; a canary that fails it before any byte hands
  it to the pool's own version;
- cascade (`gateway.serving.sending.cascade_flow.CascadeFlow`): an unsure micro answer escalates, sent back through the
  canary layer (its version, its canary fallback) and the layers below;
- dispatch (`Dispatch`): the engine call itself, JSON or stream (`gateway.serving.sending.forwarding`).

Failures before any byte reached the client travel up as the error tree's `NoReplicaAvailable` and `UpstreamError`;
an output check's verdict travels up on the reply (`JSONReply.rejected`), never as an exception.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any

from gateway.caching.answer_cache import lookup_answer
from gateway.errors import NoReplicaAvailable, UpstreamError
from gateway.serving.openai.upstream import engine_body
from gateway.serving.routing.context_fit import Need
from gateway.serving.routing.request_context import RequestContext
from gateway.serving.sending.answer_check import OutputCheckLayer
from gateway.serving.sending.calls import Call, Calls, Layer
from gateway.serving.sending.cascade_flow import CascadeFlow
from gateway.serving.sending.forwarding import JSONReply, StreamReply
from gateway.serving.sending.responses_via_chat import send_via_chat, translated
from gateway.serving.serving_parts import ServingParts
from policies.decide import RouteDecision, moved
from policies.tenant_moves import other_tiers

__all__ = ["CacheLayer", "CanaryLayer", "Dispatch", "FailoverLayer", "Layer", "sending_stack"]

log = logging.getLogger("cascade.gateway")


def sending_stack(parts: ServingParts, calls: Calls) -> Layer:
    """The layers from the cache down to the engine call (`parts.fit` set)."""
    fw = parts.forwarder
    cascade = CascadeFlow(Dispatch(parts), fw, calls, parts.wake, parts.metrics)
    canary = CanaryLayer(parts, cascade)
    cascade.escalate_through(canary)
    layer: Layer = FailoverLayer(parts, calls, canary)
    if fw.checker is not None:
        layer = OutputCheckLayer(layer, calls, fw.checker)
    return CacheLayer(parts, layer)


class CacheLayer:
    """The tenant's response cache, for the endpoints it keeps (`Endpoint.cache`). A miss's answer is kept once
    whole; the gateway's own time to here (`cascade_gateway_overhead_seconds`) is observed for every request sent
    on."""

    def __init__(self, parts: ServingParts, inner: Layer) -> None:
        self._cache = parts.cache
        self._metrics = parts.metrics
        self._inner = inner

    async def send(self, ctx: RequestContext, call: Call) -> JSONReply | StreamReply:
        cache = self._cache if ctx.endpoint.cache else None
        cached = await lookup_answer(cache, ctx.loaded.policy, call.facts, ctx.request, ctx.raw)
        if cached.reply is not None:
            return cached.reply
        self._metrics.overhead.observe(time.monotonic() - ctx.started)
        return cached.keep(await self._inner.send(ctx, replace(call, facts=cached.facts(call.facts))))


class FailoverLayer:
    """Fails over to the next tier that fits when the pool could not answer before any byte reached the client: no
    replica could take the request, or every replica tried answered 5xx (the proxy's retries spent). An engine's 4xx
    is the request's fault and is passed on. A request an output check sent again is not failed over: the check
    chose its pool."""

    def __init__(self, parts: ServingParts, calls: Calls, inner: Layer) -> None:
        assert parts.fit is not None
        self._fit = parts.fit
        self._calls = calls
        self._inner = inner

    async def send(self, ctx: RequestContext, call: Call) -> JSONReply | StreamReply:
        decision = call.decision
        try:
            return await self._inner.send(ctx, call)
        except (NoReplicaAvailable, UpstreamError) as exc:
            chosen = any(s.step == "output-check" for s in decision.route)
            other = None if exc.status < 500 or chosen else await self._other_pool(ctx, decision)
            if other is None:
                raise
            why = (f"no replica of {decision.pool!r} available" if isinstance(exc, NoReplicaAvailable)
                   else f"every replica of {decision.pool!r} answered 5xx")
            log.warning("request %s: %s (%s); failed over to %r", ctx.request_id, why, exc.message, other)
            other_decision = moved(ctx.loaded.policy, decision, "failover", other, why,
                                   f"{why}: failed over to {other!r}")
            return await self._inner.send(ctx, await self._calls.prepare(ctx, call.facts, other_decision))

    async def _other_pool(self, ctx: RequestContext, decision: RouteDecision) -> str | None:
        """The first other tier whose context holds the request (the other of micro and flagship; with
        `routing.tiers` the next one up, then down: `policies.tenant_moves.other_tiers`), when the policy allows
        failing over and the tenant may be moved there (its allowed pools, its budget, the ladder's shedding)."""
        if not ctx.loaded.policy.routing.failover:
            return None
        need = Need.of(ctx.request, ctx.raw, ctx.native)
        for other in other_tiers(ctx.loaded.policy, decision, ctx.tenant, ctx.ladder, ctx.downgrade):
            if (await self._fit.fits(ctx.loaded, other, need, ctx.raw, ctx.native, ctx.ladder))[0]:
                return other
        return None


class CanaryLayer:
    """Sends to the pool's version that takes the request (`PoolVersions.target`). A canary that fails the request
    before any byte reached the client (no replica could take it, or its engine answered 5xx) hands it to the pool's
    own version: a bad canary costs its guard's error budget, never a client's request."""

    def __init__(self, parts: ServingParts, inner: Layer) -> None:
        self._versions = parts.versions
        self._inner = inner

    async def send(self, ctx: RequestContext, call: Call) -> JSONReply | StreamReply:
        decision, pool = self._versions.target(call.decision, ctx.raw)
        try:
            return await self._inner.send(ctx, replace(call, facts=replace(call.facts, decision=decision), pool=pool,
                                                       upstream=_body(ctx, decision, call.upstream)))
        except (NoReplicaAvailable, UpstreamError) as exc:
            if not self._versions.on_canary(decision, pool) or exc.status < 500:
                raise
            log.warning("pool %s: its canary %s failed request %s (%s); the pool's own version serves it",
                        decision.pool, decision.pool_version, ctx.request_id, exc.message)
            routed = replace(call.decision, route=decision.route)  # as routed, with the canary's step
            decision, pool = self._versions.own(routed.then(
                "canary-fallback", f"its canary {decision.pool_version} failed before any byte"))
            return await self._inner.send(ctx, replace(call, facts=replace(call.facts, decision=decision), pool=pool,
                                                       upstream=_body(ctx, decision, call.upstream)))


def _body(ctx: RequestContext, decision: RouteDecision, upstream: dict[str, Any]) -> dict[str, Any]:
    """The engine's body on the version `decision` names: its model, and a batch line's priority where that
    version schedules by priority (`gateway.serving.openai.upstream.engine_body`)."""
    return engine_body(dict(upstream, model=decision.model), ctx.loaded.policy, decision, ctx.batch is not None)


class Dispatch:
    """The engine call of a call on its version's replicas (`Call.pool`): translated for a chat-only pool, streamed,
    streamed for a JSON answer where the ladder forces it (`Endpoint.force_stream`), or JSON. Shares, does not own,
    the forwarder."""

    def __init__(self, parts: ServingParts) -> None:
        self._fw = parts.forwarder

    async def send(self, ctx: RequestContext, call: Call) -> JSONReply | StreamReply:
        pool, facts, loaded, headers = call.pool, call.facts, ctx.loaded, call.headers
        assert pool is not None, "the canary layer sets the call's pool"
        if translated(loaded, facts.decision.pool, ctx.native):  # a Responses request for a chat-only pool
            return await send_via_chat(self._fw, pool, call.upstream, ctx.request, facts, loaded, headers)
        if ctx.request.stream:
            return await self._fw.stream(pool, call.upstream, ctx.request, facts, loaded, headers)
        if ctx.endpoint.force_stream and ctx.ladder.applying_to(facts.decision.pool).force_stream:
            return await self._fw.json_via_stream(pool, call.upstream, facts, loaded, headers)
        return await self._fw.json(pool, call.upstream, facts, loaded, headers)
