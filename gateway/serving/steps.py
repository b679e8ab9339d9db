"""Planning a request: admission, the first route, then the route steps, in order, and the first engine call.

Admission completes the request's context (`RequestContext.downgrade`); the router makes the first decision
(`RequestRouter.route`: pinning, rules, the score, the ladder's shedding and holds, the budget's downgrade:
`policies.decide`); then each step of `Planner.steps`, an `async (context, decision) -> decision`, may change it and
appends to its route what it did (`RouteDecision.then`, `moved`). One loop runs them: an error a step raises names
the step in its message, and the log has the route up to it. Adding a step is adding one item to `steps`. The plan
ends with the request's first engine call (`gateway.serving.sending.calls.Call`): its facts, what its records carry, and
the engine's body for its decision.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from gateway.checking.fallback import json_fallback_refused
from gateway.errors import GatewayError, NoReplicaAvailable
from gateway.serving.records.accounting import RequestFacts
from gateway.serving.records.tracing import step
from gateway.serving.routing.request_context import RequestContext
from gateway.serving.sending.answer_check import redo
from gateway.serving.sending.calls import Call, Calls
from gateway.serving.serving_parts import ServingParts
from policies.decide import RouteDecision, moved, route_text
from policies.tenant_moves import move_refused

__all__ = ["Planner", "Step"]

log = logging.getLogger("cascade.gateway")


@dataclass(frozen=True, slots=True)
class Step:
    """One route step: `name` is what its errors and its route entries say."""

    name: str
    run: Callable[[RequestContext, RouteDecision], Awaitable[RouteDecision]]


class Planner:
    """Plans requests. Shares, does not own, its parts (`ServingParts`; `parts.fit` set) and `calls`."""

    def __init__(self, parts: ServingParts, calls: Calls) -> None:
        self._parts = parts
        self._calls = calls
        self.steps: tuple[Step, ...] = (
            Step("on-demand-fallback", self._on_cold),
            Step("json-guard", self._json_guard),
            Step("context-fit", self._fit),
            Step("batch-lane", self._lane),
        )

    async def plan(self, ctx: RequestContext) -> tuple[RequestContext, Call]:
        """The context completed by admission, and the request's first call: its decision after every step. Raises
        the error of the first step that refuses the request (admission's 429s, the router's 404 and 403, ...)."""
        with step("admission"):
            verdict = await self._parts.admission.admit(ctx.loaded.policy, ctx.tenant, ctx.request,
                                                        ctx.raw["messages"], ctx.request_id, ctx.key)
        ctx = replace(ctx, downgrade=verdict is not None and verdict.downgrade)
        with step("route"):
            decision = await self._parts.router.route(ctx.request, ctx.raw, ctx.tenant, ctx.headers, ctx.loaded,
                                                      ctx.ladder, ctx.downgrade)
        for each in self.steps:
            decision = await _run(each, ctx, decision)
        return ctx, await self._first_call(ctx, decision)

    async def _first_call(self, ctx: RequestContext, decision: RouteDecision) -> Call:
        """The planned request's first engine call: its facts (what its records say) and engine body."""
        facts = RequestFacts(ctx.request_id, ctx.tenant, decision, ctx.started_wall, ctx.started, None, "ok",
                             ctx.raw if self._parts.keep_requests else None,  # the routing view: what a replay routes
                             redo=redo(self._parts.forwarder.checker, ctx, decision), endpoint=ctx.endpoint.name,
                             key_id=ctx.key.id if ctx.key is not None else "",
                             batch_id=ctx.batch.batch_id if ctx.batch else "",
                             custom_id=ctx.batch.custom_id if ctx.batch else "")
        return await self._calls.prepare(ctx, facts, decision)

    async def _on_cold(self, ctx: RequestContext, decision: RouteDecision) -> RouteDecision:
        """Wake an on-demand pool (or take its cold fallback pool, where the tenant may be moved there:
        `policies.tenant_moves`; else the request waits for the cold start). A batch line wakes none unless the
        policy's `batches.wake_on_demand` allows it: it is refused (503) and its worker tries it again later."""
        wake, policy = self._parts.wake, ctx.loaded.policy
        if ctx.batch is not None and not policy.batches.wake_on_demand and self._asleep(decision.pool):
            raise NoReplicaAvailable(f"pool {decision.pool!r} is scaled to zero and batch lines do not wake it "
                                     "(policy batches.wake_on_demand)", code="pool_asleep")

        def may_use(pool: str) -> bool:
            return move_refused(policy, ctx.tenant, pool, ctx.ladder, ctx.downgrade) is None

        target = decision.pool if wake is None else await wake(decision.pool, may_use)
        if target == decision.pool:
            return decision
        why = f"{decision.pool!r} is starting on demand"
        return moved(policy, decision, "on-demand-fallback", target, why, f"{why}: served by {target!r} meanwhile")

    def _asleep(self, pool: str) -> bool:
        sleeping = self._parts.sleeping
        return sleeping is not None and sleeping(pool)

    async def _json_guard(self, ctx: RequestContext, decision: RouteDecision) -> RouteDecision:
        """A ladder step's move refused for JSON requests while its target fails too many of them
        (`gateway.checking.fallback`)."""
        checker = self._parts.forwarder.checker
        if checker is None:
            return decision
        return json_fallback_refused(ctx.loaded.policy, decision, ctx.raw, ctx.ladder, checker.json_rates)

    async def _fit(self, ctx: RequestContext, decision: RouteDecision) -> RouteDecision:
        """The request on a tier whose context holds it (`gateway.serving.routing.context_fit`)."""
        assert self._parts.fit is not None
        return await self._parts.fit.place(ctx.loaded, decision, ctx.request, ctx.raw, ctx.native, ctx.tenant,
                                           ctx.ladder, ctx.downgrade)

    async def _lane(self, ctx: RequestContext, decision: RouteDecision) -> RouteDecision:
        """A batch line waits for headroom on the pool it was routed to (`ServingParts.lane`); its pool stays. An
        interactive request is told to the lane, which may preempt the lines on its pool (`batches.preempt`)."""
        lane = self._parts.lane
        if lane is not None and ctx.batch is not None:
            await lane.enter(ctx.loaded, decision.pool, ctx.request_id)
        elif lane is not None:
            await lane.arrived(ctx.loaded, decision.pool)
        return decision


async def _run(each: Step, ctx: RequestContext, decision: RouteDecision) -> RouteDecision:
    """`each` on `decision`. An error it raises names the step in its message, and the log has the route up to it
    (never the prompt: `policies.decide.RouteStep`)."""
    try:
        return await each.run(ctx, decision)
    except GatewayError as exc:
        log.info("request %s: route step %s refused it (%s) after route %s", ctx.request_id, each.name, exc.message,
                 route_text(decision.route) or "-")
        exc.message = f"{each.name}: {exc.message}"
        raise
