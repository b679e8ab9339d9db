"""The cascade's request flow: micro first with logprobs, keep the answer if confident, else escalate.

An unsure answer escalates only where the policy lets this request go (`policies.escalation`: the tenant's
pools, the budget downgrade, the ladder's raised threshold, pool moves and shedding), to a target woken on
demand (or its cold fallback); when none remains (or the target has no replica) the micro answer is kept,
with `x-cascade-escalation-held: <why>` and rule "cascade-held". The escalated call is held against the tenant's
budget before it is made (`Calls.hold_again`): where the budget cannot carry it, the micro answer is kept (held by
"budget"). It is then sent as every routed request is, back through the canary layer and the layers below it
(`gateway.serving.sending.layers`: its version, canary fallback, the cascade again on a middle tier, the ladder's stream
choice); when the target cannot answer it before any byte (no replica could take it:
"no-replica"; every replica tried answered 5xx: "engine-error") the micro answer is kept as well, which is the
escalation's failover. Escalation happens before any byte reaches the client. The discarded micro call is recorded
under `<request id>-probe` with status "escalated"; the escalated call under the request id, priced at its own pool's
prices. Every unsure answer is counted in `cascade_escalations{outcome, pool, held_by}`.
"""

from __future__ import annotations

from dataclasses import replace

import orjson

from backends.clients.pool import Pool, Replica
from gateway.control.fleet.on_demand import Wake
from gateway.errors import NoReplicaAvailable, UpstreamError
from gateway.serving.records.accounting import RequestFacts
from gateway.serving.routing.request_context import RequestContext
from gateway.serving.sending.calls import Call, Calls, Layer
from gateway.serving.sending.cascade import (
    StreamProbe,
    answer_logprobs,
    cascade_headers,
    confidence,
    probe_stream,
    without_logprobs,
)
from gateway.serving.sending.forwarding import Forwarder, JSONReply, StreamReply
from gateway.serving.sending.proxy import OpenStream
from gateway.telemetry.metrics import GatewayMetrics
from policies.decide import RouteDecision, served_model
from policies.escalation import Escalation, escalation
from policies.loader import LoadedPolicy
from policies.tenant_moves import move_refused

__all__ = ["CascadeFlow", "cascades"]

HELD_HEADER = "x-cascade-escalation-held"
_SERVED_AGAIN = frozenset({"failover", "output-check"})


class _NotHeld(Exception):
    """The budget cannot hold the escalated call: the micro answer stays."""


def cascades(loaded: LoadedPolicy, decision: RouteDecision) -> bool:
    """The cascade applies to requests the score sent to the micro pool (with `routing.tiers`: the trade sent to any
    tier but the top one; it escalates one tier up), when the policy enables it; not to one served again by a later
    step: failed over (the pool it would escalate to may have just failed it), or sent again by an output check
    (which has already chosen between retrying and escalating: its retry is one more call on the same pool, never a
    second escalation decision)."""
    routing = loaded.policy.routing
    lower = routing.tiers[:-1] if routing.tiers else (routing.micro_pool,)
    return (routing.cascade.enabled and decision.score is not None and decision.pool in lower
            and not any(step.step in _SERVED_AGAIN for step in decision.route))


def _probe_facts(call: Call) -> RequestFacts:
    return replace(call.facts, request_id=call.facts.request_id + "-probe", status="escalated")


def _unsure(ctx: RequestContext, conf: float) -> str:
    return f"micro answer confidence {conf:.3f} < {ctx.loaded.policy.routing.cascade.min_confidence}"


class CascadeFlow:
    """The cascade layer (`gateway.serving.sending.layers`): requests the cascade applies to (`cascades`, for endpoints
    that have it: `Endpoint.cascade`) are probed on the pool the canary layer chose (`Call.pool`) and kept or
    escalated; every other call goes on to `inner` (dispatch). Shares, does not own, the forwarder and pools. An
    escalation is made ready by `calls` (its engine body and completion limit, its hold against the budget) and sent
    through the layer it is told (`escalate_through`: the canary layer above it); `wake(pool)` (scale to zero)
    returns the pool that serves now; `metrics` counts the outcome of every unsure answer."""

    def __init__(self, inner: Layer, forwarder: Forwarder, calls: Calls, wake: Wake | None = None,
                 metrics: GatewayMetrics | None = None) -> None:
        self._inner = inner
        self._above: Layer = inner
        self._fw = forwarder
        self._calls = calls
        self._wake = wake
        self._metrics = metrics

    def escalate_through(self, layer: Layer) -> None:
        """Send escalations through `layer` (set once, when the layers are built: the canary layer wraps this one)."""
        self._above = layer

    async def send(self, ctx: RequestContext, call: Call) -> JSONReply | StreamReply:
        if not (ctx.endpoint.cascade and cascades(ctx.loaded, call.decision)):
            return await self._inner.send(ctx, call)
        assert call.pool is not None, "the canary layer sets the call's pool"
        body = orjson.dumps({**call.upstream, "logprobs": True})
        if ctx.request.stream:
            return await self._run_stream(ctx, call, call.pool, body)
        return await self._run_json(ctx, call, call.pool, body)

    async def _run_json(self, ctx: RequestContext, call: Call, pool: Pool, body: bytes) -> JSONReply:
        replica, answer = await self._fw.complete(pool, body, started=call.facts.started)
        conf = confidence(answer_logprobs(answer))
        if conf is None or conf >= ctx.loaded.policy.routing.cascade.min_confidence:
            return self._keep_json(ctx, replace(call, headers={**call.headers, **cascade_headers(False, conf)}),
                                   replica, answer)
        plan = await self._plan(ctx, call)
        if plan.pool is not None:
            try:
                reply = await self._escalate(ctx, call, plan, conf)
            except (NoReplicaAvailable, UpstreamError) as exc:
                held = _unanswered(plan, exc)
                if held is None:
                    self._fw.account_json(ctx.loaded, _probe_facts(call), replica, call.upstream, answer)
                    raise
                plan = held
            except _NotHeld as exc:
                plan = Escalation(None, "budget", str(exc))
            except BaseException:
                self._fw.account_json(ctx.loaded, _probe_facts(call), replica, call.upstream, answer)
                raise
            else:
                self._fw.account_json(ctx.loaded, _probe_facts(call), replica, call.upstream, answer)
                assert isinstance(reply, JSONReply)
                return reply
        return self._keep_json(ctx, self._hold(ctx, call, plan, conf), replica, answer)

    def _keep_json(self, ctx: RequestContext, call: Call, replica: Replica, answer: bytes) -> JSONReply:
        """Serve the micro answer, once the output checks have judged it (`Forwarder.judged`): recorded unless a
        check rejected it (recorded as discarded there)."""
        served = answer if ctx.request.logprobs else without_logprobs(answer)
        facts, checked, rejected = self._fw.judged(ctx.loaded, call.facts, replica, call.upstream, served)
        if rejected is None:
            self._fw.account_json(ctx.loaded, facts, replica, call.upstream, answer)
        return JSONReply(served, facts.decision, {**call.headers, **checked}, rejected)

    async def _run_stream(self, ctx: RequestContext, call: Call, pool: Pool, body: bytes) -> StreamReply:
        opened = await self._fw.open(pool, body)
        try:
            probe = await probe_stream(opened, ctx.loaded.policy.routing.cascade.first_tokens)
        except BaseException:
            await opened.upstream.aclose()
            raise
        conf = confidence(probe.logprobs)
        if conf is None or conf >= ctx.loaded.policy.routing.cascade.min_confidence:
            headers = {**call.headers, **cascade_headers(False, conf)}
            return self._fw.relay(opened, probe.held, call.upstream, ctx.request, call.facts, ctx.loaded, headers)
        try:
            plan = await self._plan(ctx, call)
            # the flagship stream opens before the micro one closes: with no replica there, the micro one is kept
            reply = await self._escalate(ctx, call, plan, conf) if plan.pool is not None else None
        except (NoReplicaAvailable, UpstreamError) as exc:
            held = _unanswered(plan, exc)
            if held is None:
                await self._drop_probe(ctx, opened, call, probe)
                raise
            plan, reply = held, None
        except _NotHeld as exc:
            plan, reply = Escalation(None, "budget", str(exc)), None
        except BaseException:
            await self._drop_probe(ctx, opened, call, probe)
            raise
        if reply is not None:
            await self._drop_probe(ctx, opened, call, probe)
            assert isinstance(reply, StreamReply)
            return reply
        kept = self._hold(ctx, call, plan, conf)
        return self._fw.relay(opened, probe.held, kept.upstream, ctx.request, kept.facts, ctx.loaded, kept.headers)

    async def _drop_probe(self, ctx: RequestContext, opened: OpenStream, call: Call, probe: StreamProbe) -> None:
        await opened.upstream.aclose()  # aborts the micro request on the engine
        self._fw.account_partial(ctx.loaded, _probe_facts(call), opened.replica, call.upstream, probe.text,
                                 len(probe.logprobs))

    async def _plan(self, ctx: RequestContext, call: Call) -> Escalation:
        """Where the unsure answer may go now: the policy's answer, then the target woken on demand."""
        policy, answered = ctx.loaded.policy, call.decision.pool
        plan = escalation(policy, ctx.tenant, ctx.ladder, ctx.downgrade, answered)
        if plan.pool is None or self._wake is None:
            return plan
        def may_use(pool: str) -> bool:  # the target's cold fallback: the same tenant decision
            return move_refused(policy, ctx.tenant, pool, ctx.ladder, ctx.downgrade) is None

        try:
            serving = await self._wake(plan.pool, may_use)
        except NoReplicaAvailable as exc:  # a cold start past its timeout
            return Escalation(None, "on-demand", f"{plan.pool!r} is starting on demand ({exc})")
        if serving == plan.pool:
            return plan
        if serving == answered:
            return Escalation(None, "on-demand", f"{plan.pool!r} is starting on demand; its fallback is {serving!r}")
        return Escalation(serving, None, f"{plan.reason}; {plan.pool!r} is starting on demand: {serving!r} serves")

    async def _escalate(self, ctx: RequestContext, call: Call, plan: Escalation,
                        conf: float) -> JSONReply | StreamReply:
        """Send the request to `plan.pool` as any request is sent there (through the canary layer)."""
        assert plan.pool is not None
        target, unsure = plan.pool, _unsure(ctx, conf)
        escalated = call.decision.then("cascade", unsure, pool=target, rule="cascade",
                                       model=served_model(ctx.loaded.policy, target), reason=f"{unsure}: {plan.reason}")
        again = await self._calls.prepare(ctx, call.facts, escalated)
        if not await self._calls.hold_again(ctx, again):
            raise _NotHeld(f"tenant {ctx.tenant!r}'s budget cannot hold a call on {target!r}")
        reply = await self._above.send(ctx, replace(again, headers={**again.headers, **cascade_headers(True, conf)}))
        self._count("escalated", target, "")
        return reply

    def _hold(self, ctx: RequestContext, call: Call, plan: Escalation, conf: float) -> Call:
        """`call` with the decision saying why the unsure answer stays, and its response headers."""
        self._count("held", call.decision.pool, plan.held or "unknown")
        d, unsure = call.decision, _unsure(ctx, conf)
        decision = d.then("cascade-held", f"{unsure}; kept: {plan.held or 'unknown'}", rule="cascade-held",
                          reason=f"{d.reason}; {unsure}, kept: {plan.reason}")
        headers = {**call.headers, **cascade_headers(False, conf), HELD_HEADER: plan.held or "unknown"}
        return replace(call, facts=replace(call.facts, decision=decision), headers=headers)

    def _count(self, outcome: str, pool: str, held_by: str) -> None:
        if self._metrics is not None:
            self._metrics.escalations.labels(outcome, pool, held_by).inc()


def _unanswered(plan: Escalation, exc: NoReplicaAvailable | UpstreamError) -> Escalation | None:
    """Why the unsure answer stays when its escalation could not be answered before any byte: no replica took it,
    or every replica tried answered 5xx (after its canary's fallback). None for an engine's 4xx: the request's
    fault, passed on to the client."""
    if isinstance(exc, NoReplicaAvailable):
        return Escalation(None, "no-replica", f"{plan.pool!r} has no replica available ({exc})")
    if exc.status >= 500:
        return Escalation(None, "engine-error", f"every replica of {plan.pool!r} answered 5xx ({exc})")
    return None
