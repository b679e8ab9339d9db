"""The cascade's request flow: micro first with logprobs, keep the answer if confident, else escalate.

An unsure answer escalates only where the policy lets this request go (`policies.escalation`: the tenant's
pools, the budget downgrade, the ladder's raised threshold, pool moves and shedding), to a target woken on
demand (or its cold fallback); when none remains (or the target has no replica) the micro answer is kept,
with `x-cascade-escalation-held: <why>` and rule "cascade-held". The escalated call is held against the tenant's
budget before it is made (`Admission.hold_again`): where the budget cannot carry it, the micro answer is kept (held by
"budget"). It is then sent as every routed request is (`Forward`: the service's version targeting and canary
fallback, the ladder's stream choice); when the target cannot answer it before any byte (no replica could take it:
"no-replica"; every replica tried answered 5xx: "engine-error") the micro answer is kept as well, which is the
escalation's failover. Escalation happens before any byte reaches the client. The discarded micro call is recorded
under `<request id>-probe` with status "escalated"; the escalated call under the request id, priced at its own pool's
prices. Every unsure answer is counted in `cascade_escalations{outcome, pool, held_by}`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import orjson

from backends.clients.pool import Pool
from gateway.control.metrics import GatewayMetrics
from gateway.control.on_demand import Wake
from gateway.errors import NoReplicaAvailable, UpstreamError
from gateway.serving.accounting import RequestFacts
from gateway.serving.cascade import (
    StreamProbe,
    answer_logprobs,
    cascade_headers,
    confidence,
    probe_stream,
    without_logprobs,
)
from gateway.serving.completion_limit import SetLimit
from gateway.serving.endpoints import NativeBody
from gateway.serving.forwarding import Forwarder, JSONReply, StreamReply
from gateway.serving.proxy import OpenStream
from gateway.serving.schema import ChatRequest
from policies.decide import RouteDecision, served_model
from policies.escalation import Escalation, escalation
from policies.ladder import LadderState
from policies.loader import LoadedPolicy
from policies.tenant_moves import move_refused

__all__ = ["CascadeFlow", "CascadeTurn", "Forward", "cascades"]

HELD_HEADER = "x-cascade-escalation-held"
Prepare = Callable[[LoadedPolicy, "CascadeTurn", RouteDecision, ChatRequest],
                   Awaitable[tuple[dict[str, Any], dict[str, str], SetLimit]]]
"""The engine body for a decision, its ladder headers and the completion limit set on it."""
HoldAgain = Callable[[LoadedPolicy, RequestFacts, ChatRequest, dict[str, Any], str, SetLimit], Awaitable[bool]]
"""Hold a second engine call (facts of the request, its prompt, target pool, limit) before it is made: False when
the budget cannot carry it."""
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


@dataclass(frozen=True, slots=True)
class CascadeTurn:
    """What the request was routed under, for its escalation: the client's body, the ladder state, whether the
    budget downgrades the tenant, and the ladder's response headers for the micro call."""

    raw: dict[str, Any]
    ladder: LadderState
    downgrade: bool
    headers: dict[str, str]
    native: NativeBody | None = None  # a Responses or completions body (`gateway.serving.endpoints`): never cascaded


@dataclass(frozen=True, slots=True)
class _Call:
    upstream: dict[str, Any]
    request: ChatRequest
    facts: RequestFacts
    loaded: LoadedPolicy
    turn: CascadeTurn

    @property
    def probe_facts(self) -> RequestFacts:
        return replace(self.facts, request_id=self.facts.request_id + "-probe", status="escalated")

    def unsure(self, conf: float) -> str:
        return f"micro answer confidence {conf:.3f} < {self.loaded.policy.routing.cascade.min_confidence}"

    def held(self, plan: Escalation, conf: float) -> tuple[_Call, dict[str, str]]:
        """This call with the decision saying why the unsure answer stays, and its response headers."""
        d = self.facts.decision
        decision = d.then("cascade-held", f"{self.unsure(conf)}; kept: {plan.held or 'unknown'}", rule="cascade-held",
                          reason=f"{d.reason}; {self.unsure(conf)}, kept: {plan.reason}")
        headers = {**self.turn.headers, **cascade_headers(False, conf), HELD_HEADER: plan.held or "unknown"}
        return replace(self, facts=replace(self.facts, decision=decision)), headers


Forward = Callable[[dict[str, Any], ChatRequest, RequestFacts, LoadedPolicy, CascadeTurn],
                   Awaitable[JSONReply | StreamReply]]
"""`(upstream, request, facts, loaded, turn)`: send a routed request to `facts.decision`'s pool as the service
sends every request (its version, canary fallback, stream or JSON; `turn.headers` go on the reply)."""


class CascadeFlow:
    """Shares, does not own, the forwarder and pools. `forward` sends the escalated call (`Forward`) once `prepare`
    has made its engine body and completion limit and `hold_again` has held it against the budget; `wake(pool)`
    (scale to zero) returns the pool that serves now; `metrics` counts the outcome of every unsure answer."""

    def __init__(self, forwarder: Forwarder, forward: Forward, prepare: Prepare, hold_again: HoldAgain,
                 wake: Wake | None = None, metrics: GatewayMetrics | None = None) -> None:
        self._fw = forwarder
        self._forward = forward
        self._wake = wake
        self._metrics = metrics
        self._prepare = prepare
        self._hold_again = hold_again

    async def run(self, pool: Pool, upstream: dict[str, Any], request: ChatRequest, facts: RequestFacts,
                  loaded: LoadedPolicy, turn: CascadeTurn) -> JSONReply | StreamReply:
        call = _Call(upstream, request, facts, loaded, turn)
        body = orjson.dumps({**upstream, "logprobs": True})
        if request.stream:
            return await self._run_stream(pool, body, call)
        return await self._run_json(pool, body, call)

    async def _run_json(self, pool: Pool, body: bytes, call: _Call) -> JSONReply:
        replica, answer = await self._fw.complete(pool, body, started=call.facts.started)
        conf = confidence(answer_logprobs(answer))
        if conf is None or conf >= call.loaded.policy.routing.cascade.min_confidence:
            return self._keep_json(call, replica, answer, {**call.turn.headers, **cascade_headers(False, conf)})
        plan = await self._plan(call)
        if plan.pool is not None:
            try:
                reply = await self._escalate(call, plan, conf)
            except (NoReplicaAvailable, UpstreamError) as exc:
                held = _unanswered(plan, exc)
                if held is None:
                    self._fw.account_json(call.loaded, call.probe_facts, replica, call.upstream, answer)
                    raise
                plan = held
            except _NotHeld as exc:
                plan = Escalation(None, "budget", str(exc))
            except BaseException:
                self._fw.account_json(call.loaded, call.probe_facts, replica, call.upstream, answer)
                raise
            else:
                self._fw.account_json(call.loaded, call.probe_facts, replica, call.upstream, answer)
                assert isinstance(reply, JSONReply)
                return reply
        kept, headers = self._hold(call, plan, conf)
        return self._keep_json(kept, replica, answer, headers)

    def _keep_json(self, call: _Call, replica: Any, answer: bytes, headers: dict[str, str]) -> JSONReply:
        """Serve the micro answer, once the output checks have judged it (`Forwarder.judged`)."""
        served = answer if call.request.logprobs else without_logprobs(answer)
        facts, checked = self._fw.judged(call.loaded, call.facts, replica, call.upstream, served)
        self._fw.account_json(call.loaded, facts, replica, call.upstream, answer)
        return JSONReply(served, facts.decision, {**headers, **checked})

    async def _run_stream(self, pool: Pool, body: bytes, call: _Call) -> StreamReply:
        opened = await self._fw.open(pool, body)
        try:
            probe = await probe_stream(opened, call.loaded.policy.routing.cascade.first_tokens)
        except BaseException:
            await opened.upstream.aclose()
            raise
        conf = confidence(probe.logprobs)
        if conf is None or conf >= call.loaded.policy.routing.cascade.min_confidence:
            headers = {**call.turn.headers, **cascade_headers(False, conf)}
            return self._fw.relay(opened, probe.held, call.upstream, call.request, call.facts, call.loaded, headers)
        try:
            plan = await self._plan(call)
            # the flagship stream opens before the micro one closes: with no replica there, the micro one is kept
            reply = await self._escalate(call, plan, conf) if plan.pool is not None else None
        except (NoReplicaAvailable, UpstreamError) as exc:
            held = _unanswered(plan, exc)
            if held is None:
                await self._drop_probe(opened, call, probe)
                raise
            plan, reply = held, None
        except _NotHeld as exc:
            plan, reply = Escalation(None, "budget", str(exc)), None
        except BaseException:
            await self._drop_probe(opened, call, probe)
            raise
        if reply is not None:
            await self._drop_probe(opened, call, probe)
            assert isinstance(reply, StreamReply)
            return reply
        kept, headers = self._hold(call, plan, conf)
        return self._fw.relay(opened, probe.held, kept.upstream, kept.request, kept.facts, kept.loaded, headers)

    async def _drop_probe(self, opened: OpenStream, call: _Call, probe: StreamProbe) -> None:
        await opened.upstream.aclose()  # aborts the micro request on the engine
        self._fw.account_partial(call.loaded, call.probe_facts, opened.replica, call.upstream, probe.text,
                                 len(probe.logprobs))

    async def _plan(self, call: _Call) -> Escalation:
        """Where the unsure answer may go now: the policy's answer, then the target woken on demand."""
        turn, policy = call.turn, call.loaded.policy
        answered = call.facts.decision.pool
        plan = escalation(policy, call.facts.tenant, turn.ladder, turn.downgrade, answered)
        if plan.pool is None or self._wake is None:
            return plan
        def may_use(pool: str) -> bool:  # the target's cold fallback: the same tenant decision
            return move_refused(policy, call.facts.tenant, pool, turn.ladder, turn.downgrade) is None

        try:
            serving = await self._wake(plan.pool, may_use)
        except NoReplicaAvailable as exc:  # a cold start past its timeout
            return Escalation(None, "on-demand", f"{plan.pool!r} is starting on demand ({exc})")
        if serving == plan.pool:
            return plan
        if serving == answered:
            return Escalation(None, "on-demand", f"{plan.pool!r} is starting on demand; its fallback is {serving!r}")
        return Escalation(serving, None, f"{plan.reason}; {plan.pool!r} is starting on demand: {serving!r} serves")

    async def _escalate(self, call: _Call, plan: Escalation, conf: float) -> JSONReply | StreamReply:
        """Send the request to `plan.pool` as the service sends any request there (`Forward`)."""
        assert plan.pool is not None
        target, loaded, request, turn = plan.pool, call.loaded, call.request, call.turn
        escalated = call.facts.decision.then("cascade", call.unsure(conf), pool=target, rule="cascade",
                                             model=served_model(loaded.policy, target),
                                             reason=f"{call.unsure(conf)}: {plan.reason}")
        upstream, extra, limit = await self._prepare(loaded, turn, escalated, request)
        if not await self._hold_again(loaded, call.facts, request, turn.raw, target, limit):
            raise _NotHeld(f"tenant {call.facts.tenant!r}'s budget cannot hold a call on {target!r}")
        reply = await self._forward(upstream, request, replace(call.facts, decision=escalated, limit_set=limit),
                                    loaded, replace(turn, headers={**extra, **cascade_headers(True, conf)}))
        self._count("escalated", target, "")
        return reply

    def _hold(self, call: _Call, plan: Escalation, conf: float) -> tuple[_Call, dict[str, str]]:
        self._count("held", call.facts.decision.pool, plan.held or "unknown")
        return call.held(plan, conf)

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
