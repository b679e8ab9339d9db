"""The output check layer: a JSON answer that failed a check which replaces it is sent again, once.

The checks judge an answer where it is made (`Forwarder.judged`): an answer a check replaces comes back up on its
reply (`JSONReply.rejected`, already recorded as discarded), and this layer acts on it. What a request's answer may
have done to it (`redo`) is decided when it is planned and carried on its facts (`RequestFacts.redo`).
"""

from __future__ import annotations

import logging
from dataclasses import replace

from gateway.checking.judge import ACTION_HEADER, CHECK_HEADER, OutputChecker, Rejection
from gateway.errors import NoReplicaAvailable, UpstreamError
from gateway.serving.routing.request_context import RequestContext
from gateway.serving.sending.calls import Call, Calls, Layer
from gateway.serving.sending.forwarding import JSONReply, StreamReply
from policies.decide import RouteDecision, moved
from policies.escalation import escalation

__all__ = ["OutputCheckLayer", "redo"]

log = logging.getLogger("cascade.gateway")


def redo(checker: OutputChecker | None, ctx: RequestContext, decision: RouteDecision) -> tuple[str, ...]:
    """What a failed output check may do with this request's answer: retry it, and escalate it where the tenant
    decision of cascade escalations lets it go up (`policies.escalation`) and the client did not pin the model (its
    caller asked for that model). Streams, and endpoints whose answers are not checked: nothing."""
    if checker is None or ctx.request.stream or not ctx.endpoint.checks:
        return ()
    actions = set(checker.plan(ctx.loaded.policy, ctx.tenant, decision.pool)[0].values())
    allowed: tuple[str, ...] = ("retry",) if "retry" in actions else ()
    if ("escalate" in actions and decision.rule != "pinned"
            and escalation(ctx.loaded.policy, ctx.tenant, ctx.ladder, ctx.downgrade, decision.pool).pool is not None):
        allowed += ("escalate",)
    return allowed


class OutputCheckLayer:
    """Asks the next pool up (escalate) or the same pool again (retry) for an answer a check replaced, once, judged
    again but never replaced twice. The second call goes through the layers below as any request (its version,
    canary fallback) but is neither cascaded (`cascade_flow.cascades`) nor failed over: the check chose its pool.
    Where it cannot be had (the budget cannot hold it, no replica, an engine error), the first answer is served,
    flagged (`x-cascade-output-check-action: held:...`). Shares, does not own, the checker."""

    def __init__(self, inner: Layer, calls: Calls, checker: OutputChecker) -> None:
        self._inner = inner
        self._calls = calls
        self._checker = checker

    async def send(self, ctx: RequestContext, call: Call) -> JSONReply | StreamReply:
        reply = await self._inner.send(ctx, call)
        if not isinstance(reply, JSONReply) or reply.rejected is None:
            return reply
        return await self._answer_again(ctx, call, reply, reply.rejected)

    async def _answer_again(self, ctx: RequestContext, call: Call, first: JSONReply,
                            rejected: Rejection) -> JSONReply | StreamReply:
        answered, verdict = first.decision, rejected.verdict
        checks = ",".join(verdict.failed)
        why = f"the {answered.pool!r} answer failed output check(s) {checks}"
        plan = escalation(ctx.loaded.policy, ctx.tenant, ctx.ladder, ctx.downgrade, answered.pool)
        if rejected.action == "escalate" and plan.pool is not None:
            decision = moved(ctx.loaded.policy, answered, "output-check", plan.pool, f"failed {checks}: escalated",
                             f"{why}: {plan.reason}")
            done = "escalated"
        else:
            decision = answered.then("output-check", f"failed {checks}: retried",
                                     reason=f"{answered.reason}; {why}: retried")
            done = "retried"
        again = await self._calls.prepare(ctx, replace(call.facts, redo=()), decision)
        if not await self._calls.hold_again(ctx, again):
            return await self._first_answer(ctx, call, first, rejected,
                                            f"{why}; not {done}: the tenant's budget cannot hold another answer")
        try:
            reply = await self._inner.send(ctx, again)
        except (NoReplicaAvailable, UpstreamError) as exc:
            return await self._first_answer(ctx, call, first, rejected, f"{why}; {done} failed ({exc.message})")
        self._checker.acted(answered.pool, verdict, done)
        return replace(reply, headers={**reply.headers, ACTION_HEADER: f"{done}:{checks}"})

    async def _first_answer(self, ctx: RequestContext, call: Call, first: JSONReply, rejected: Rejection,
                            why: str) -> JSONReply:
        """Serve the answer that failed its checks, flagged (`held:<checks>`): no other could be had (`why`). It is
        recorded as discarded, so nothing records the request's id: its budget holds go back now."""
        log.warning("request %s: %s: the first answer is served", ctx.request_id, why)
        self._checker.acted(first.decision.pool, rejected.verdict, "held")
        await self._calls.give_back_hold(ctx)
        checks = ",".join(rejected.verdict.failed)
        headers = {**call.headers, CHECK_HEADER: rejected.verdict.header, ACTION_HEADER: f"held:{checks}"}
        return JSONReply(first.body, first.decision, headers)
