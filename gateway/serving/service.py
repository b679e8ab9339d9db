"""The chat-completions service: route → prepare the engine request → forward (plain or cascade).

HTTP-free: it takes a validated `ChatRequest` and returns a reply for `gateway.api.app` to render.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Mapping
from dataclasses import replace
from typing import Any

from backends.clients.pool import Pool
from gateway.caching.answer_cache import AnswerCache, lookup_answer
from gateway.checking.fallback import json_fallback_refused
from gateway.checking.judge import ACTION_HEADER, CHECK_HEADER, OutputRejected
from gateway.control.degradation import DegradationMonitor
from gateway.control.metrics import GatewayMetrics
from gateway.control.on_demand import Wake
from gateway.control.policy_holder import PolicyHolder
from gateway.errors import BadRequest, GatewayError, NoReplicaAvailable, UpstreamError
from gateway.guards.screen import InputGuard
from gateway.learning.loop import LearningTap
from gateway.serving.accounting import RequestFacts
from gateway.serving.cascade_flow import CascadeFlow, CascadeTurn, cascades
from gateway.serving.completion_limit import CompletionLimits, SetLimit, held_completion
from gateway.serving.context_fit import ContextFit, Need
from gateway.serving.endpoints import CHAT, NativeBody, native_upstream
from gateway.serving.forwarding import Forwarder, JSONReply, StreamReply
from gateway.serving.responses_via_chat import send_via_chat, translated
from gateway.serving.router import RequestRouter
from gateway.serving.schema import ChatRequest
from gateway.serving.tracing import step
from gateway.serving.upstream import prepare_upstream
from gateway.serving.versions import PoolVersions
from gateway.tenancy.admission import Admission
from gateway.tenancy.api_keys import ApiKey
from policies.decide import RouteDecision, moved, route_text
from policies.escalation import escalation
from policies.ladder import LadderState
from policies.loader import LoadedPolicy
from policies.tenant_moves import move_refused, other_tiers

__all__ = ["ChatService", "JSONReply", "StreamReply"]

log = logging.getLogger("cascade.gateway")


class ChatService:
    """Handles one chat request end to end. Shares, but does not own, its collaborators."""

    def __init__(self, policies: PolicyHolder, versions: PoolVersions, router: RequestRouter, forwarder: Forwarder,
                 degradation: DegradationMonitor, metrics: GatewayMetrics, admission: Admission,
                 keep_requests: bool = False, wake: Wake | None = None,
                 learning: LearningTap | None = None, cache: AnswerCache | None = None,
                 fit: ContextFit | None = None) -> None:
        """`versions` gives each routed request its pool's replicas (the pool's own, or its canary's). `wake(pool)`
        (scale to zero, `gateway.control.on_demand`) returns the pool that serves now. `learning` sees every
        answered request (policy `learning:`). `cache` answers from, and keeps answers in, a tenant's response cache
        (`gateway.caching`: after routing, before forwarding). `fit` places a request by its length
        (`gateway.serving.context_fit`; None: `versions`' pools, counted by the forwarder's engine client)."""
        self._policies = policies
        self._wake = wake
        self._versions = versions
        self._router = router
        self._fw = forwarder
        self._degradation = degradation
        self._metrics = metrics
        self._keep_requests = keep_requests
        self._admission = admission
        self._cascade = CascadeFlow(forwarder, self._forward, self._upstream, self._hold_again, wake, metrics)
        self._learning = learning
        self._cache = cache
        self._guard = InputGuard(metrics.guard_decision)
        self._checker = forwarder.checker
        self._fit = fit or ContextFit(forwarder.engines, versions.pool)
        self._limits = CompletionLimits(self._fit)

    async def handle(self, request: ChatRequest, raw: dict[str, Any], tenant: str, request_id: str,
                     headers: Mapping[str, str] | None = None, native: NativeBody | None = None,
                     key: ApiKey | None = None) -> JSONReply | StreamReply:
        """`native`: the body of a Responses or completions request, whose routing view `request` and `raw` are
        (`gateway.serving.endpoints`); None for a chat request. `key`: the caller's API key (its limits apply
        inside the tenant's; its id goes on the cost records)."""
        # the tenant's input guards, before admission and routing: all that follows sees the redacted body
        screened = self._guard.screen(self._policies.current.policy, tenant, request, raw)
        if native is not None and screened.raw is not raw:
            raise BadRequest(f"the tenant's input guards rewrite prompts (redaction), which {native.endpoint.path} "
                             "does not support here; use /v1/chat/completions", code="guard_unsupported_endpoint")
        request, raw = screened.request, screened.raw
        async with self._admission.refunds(request_id):  # refused after admission: its limits and hold go back
            reply = await self._handle(request, raw, tenant, request_id, headers, native, key)
        self._metrics.route_taken(reply.decision.route)
        if self._learning is not None and native is None:
            self._learning.observe(reply, raw, tenant, request_id, self._policies.current)
        return replace(reply, headers={**reply.headers, **screened.headers}) if screened.decisions else reply

    async def _handle(self, request: ChatRequest, raw: dict[str, Any], tenant: str, request_id: str,
                      headers: Mapping[str, str] | None, native: NativeBody | None,
                      key: ApiKey | None = None) -> JSONReply | StreamReply:
        started, started_wall = time.monotonic(), time.time()
        loaded = self._policies.current
        self._degradation.use_policy(loaded)
        ladder = self._degradation.state
        with step("admission"):
            verdict = await self._admission.admit(loaded.policy, tenant, request, raw["messages"], request_id, key)
        downgrade = verdict is not None and verdict.downgrade
        # the route, step by step (each appends to `decision.route`; `policies.decide` for the first ones)
        with step("route"):
            decision = await self._router.route(request, raw, tenant, headers or {}, loaded, ladder, downgrade)
        decision = await _step("on-demand-fallback", request_id, decision,
                               self._on_cold(decision, loaded, tenant, ladder, downgrade))
        if self._checker is not None:
            decision = json_fallback_refused(loaded.policy, decision, raw, ladder, self._checker.json_rates)
        decision = await _step("context-fit", request_id, decision,
                               self._fit.place(loaded, decision, request, raw, native, tenant, ladder, downgrade))
        turn = CascadeTurn(raw, ladder, downgrade, {}, native)
        upstream, extra, limit = await self._upstream(loaded, turn, decision, request)
        turn = replace(turn, headers=extra)
        kept = raw if self._keep_requests else None  # the routing view: what a replay routes again
        redo = self._redo(loaded, tenant, decision, request, ladder, downgrade) if native is None else ()
        facts = RequestFacts(request_id, tenant, decision, started_wall, started, None, "ok", kept,
                             redo=redo, endpoint=CHAT.name if native is None else native.endpoint.name,
                             key_id=key.id if key is not None else "", limit_set=limit)
        # the response cache keeps chat answers only (its key is the chat body)
        cached = await lookup_answer(self._cache if native is None else None, loaded.policy, facts, request, raw)
        if cached.reply is not None:
            return cached.reply
        facts = cached.facts(facts)
        self._metrics.overhead.observe(time.monotonic() - started)
        try:
            return cached.keep(await self._serve(upstream, request, facts, loaded, turn))
        except OutputRejected as rejected:
            return cached.keep(await self._answer_again(rejected, request, facts, loaded, turn))

    def _redo(self, loaded: LoadedPolicy, tenant: str, decision: RouteDecision, request: ChatRequest,
              ladder: LadderState, downgrade: bool) -> tuple[str, ...]:
        """What a failed output check may do with this request's answer: retry it, and escalate it where the
        tenant decision of cascade escalations lets it go up (`policies.escalation`) and the client did not pin the
        model (its caller asked for that model). Streams: nothing."""
        if self._checker is None or request.stream:
            return ()
        actions = set(self._checker.plan(loaded.policy, tenant, decision.pool)[0].values())
        redo: tuple[str, ...] = ("retry",) if "retry" in actions else ()
        if ("escalate" in actions and decision.rule != "pinned"
                and escalation(loaded.policy, tenant, ladder, downgrade, decision.pool).pool is not None):
            redo += ("escalate",)
        return redo

    async def _answer_again(self, rejected: OutputRejected, request: ChatRequest, facts: RequestFacts,
                            loaded: LoadedPolicy, turn: CascadeTurn) -> JSONReply | StreamReply:
        """A JSON answer failed an output check that replaces it: ask the next pool up (escalate) or the same pool
        again (retry), once, judged again but never replaced twice. The second call is forwarded as any request
        (its version, canary fallback) but neither cascaded (`cascade_flow.cascades`) nor failed over: the check
        chose its pool. Where that cannot be had (no replica, an engine error), the first answer is served, flagged
        (`x-cascade-output-check-action: held:...`)."""
        assert self._checker is not None
        answered, verdict = rejected.decision, rejected.verdict
        checks = ",".join(verdict.failed)
        why = f"the {answered.pool!r} answer failed output check(s) {checks}"
        plan = escalation(loaded.policy, facts.tenant, turn.ladder, turn.downgrade, answered.pool)
        if rejected.action == "escalate" and plan.pool is not None:
            decision = moved(loaded.policy, answered, "output-check", plan.pool, f"failed {checks}: escalated",
                             f"{why}: {plan.reason}")
            done = "escalated"
        else:
            decision = answered.then("output-check", f"failed {checks}: retried",
                                     reason=f"{answered.reason}; {why}: retried")
            done = "retried"
        upstream, extra, limit = await self._upstream(loaded, turn, decision, request)
        if not await self._hold_again(loaded, facts, request, turn.raw, decision.pool, limit):
            return await self._first_answer(rejected, facts, turn, f"{why}; not {done}: the tenant's budget cannot "
                                            "hold another answer")
        try:
            reply = await self._forward(upstream, request, replace(facts, decision=decision, redo=(), limit_set=limit),
                                        loaded, replace(turn, headers=extra))
        except (NoReplicaAvailable, UpstreamError) as exc:
            return await self._first_answer(rejected, facts, turn, f"{why}; {done} failed ({exc.message})")
        self._checker.acted(answered.pool, verdict, done)
        return replace(reply, headers={**reply.headers, ACTION_HEADER: f"{done}:{checks}"})

    async def _first_answer(self, rejected: OutputRejected, facts: RequestFacts, turn: CascadeTurn,
                            why: str) -> JSONReply:
        """Serve the answer that failed its checks, flagged (`held:<checks>`): no other could be had (`why`). It is
        recorded as discarded, so nothing records the request's id: its budget holds go back now."""
        assert self._checker is not None
        log.warning("request %s: %s: the first answer is served", facts.request_id, why)
        self._checker.acted(rejected.decision.pool, rejected.verdict, "held")
        await self._admission.give_back_hold(facts.request_id)
        checks = ",".join(rejected.verdict.failed)
        headers = {**turn.headers, CHECK_HEADER: rejected.verdict.header, ACTION_HEADER: f"held:{checks}"}
        return JSONReply(rejected.body, rejected.decision, headers)

    async def _serve(self, upstream: dict[str, Any], request: ChatRequest, facts: RequestFacts,
                     loaded: LoadedPolicy, turn: CascadeTurn) -> JSONReply | StreamReply:
        """Forward, failing over to the next tier that fits (`_failover_pool`) when the pool could not answer before
        any byte reached the client: no replica could take the request, or every replica tried answered 5xx (the
        proxy's retries spent). An engine's 4xx is the request's fault and is passed on."""
        decision, tenant = facts.decision, facts.tenant
        try:
            return await self._forward(upstream, request, facts, loaded, turn)
        except (NoReplicaAvailable, UpstreamError) as exc:
            need = Need.of(request, turn.raw, turn.native)
            other = await self._failover_pool(loaded, decision, tenant, turn, need) if exc.status >= 500 else None
            if other is None:
                raise
            why = (f"no replica of {decision.pool!r} available" if isinstance(exc, NoReplicaAvailable)
                   else f"every replica of {decision.pool!r} answered 5xx")
            log.warning("request %s: %s (%s); failed over to %r", facts.request_id, why, exc.message, other)
            other_decision = moved(loaded.policy, decision, "failover", other, why, f"{why}: failed over to {other!r}")
            upstream, extra, limit = await self._upstream(loaded, turn, other_decision, request)
            turn = replace(turn, headers=extra)
            return await self._forward(upstream, request, replace(facts, decision=other_decision, limit_set=limit),
                                       loaded, turn)

    async def _upstream(self, loaded: LoadedPolicy, turn: CascadeTurn, decision: RouteDecision,
                        request: ChatRequest) -> tuple[dict[str, Any], dict[str, str], SetLimit]:
        """The engine's body for `decision` (`_upstream`) with the completion limit the gateway sets on it
        (`gateway.serving.completion_limit`), the ladder's response headers, and that limit."""
        upstream, extra = _upstream(turn, decision, request)
        endpoint = CHAT.name if turn.native is None else turn.native.endpoint.name
        upstream, limit = await self._limits.apply(loaded, decision.pool, request.completion_limit, upstream,
                                                   endpoint)
        return upstream, extra, limit

    async def _hold_again(self, loaded: LoadedPolicy, facts: RequestFacts, request: ChatRequest,
                          raw: dict[str, Any], pool: str, limit: SetLimit) -> bool:
        """Hold a second engine call of the request on `pool` before it is made (`Admission.hold_again`): its
        prompt `raw["messages"]` and completion limit."""
        completion = limit.tokens or held_completion(loaded.policy, pool, request.completion_limit)
        return await self._admission.hold_again(loaded.policy, facts.tenant, facts.request_id, pool,
                                                raw["messages"], completion * request.n)

    async def _failover_pool(self, loaded: LoadedPolicy, decision: RouteDecision, tenant: str, turn: CascadeTurn,
                             need: Need) -> str | None:
        """The first other tier whose context holds the request (the other of micro and flagship; with
        `routing.tiers` the next one up, then down: `policies.tenant_moves.other_tiers`), when the policy allows
        failing over and the tenant may be moved there (its allowed pools, its budget, the ladder's shedding)."""
        if not loaded.policy.routing.failover:
            return None
        for other in other_tiers(loaded.policy, decision, tenant, turn.ladder, turn.downgrade):
            if (await self._fit.fits(loaded, other, need, turn.raw, turn.native, turn.ladder))[0]:
                return other
        return None

    async def _on_cold(self, decision: RouteDecision, loaded: LoadedPolicy, tenant: str, ladder: LadderState,
                       downgrade: bool) -> RouteDecision:
        """Wake an on-demand pool (or take its cold fallback pool, where the tenant may be moved there:
        `policies.tenant_moves`; else the request waits for the cold start)."""
        def may_use(pool: str) -> bool:
            return move_refused(loaded.policy, tenant, pool, ladder, downgrade) is None

        target = decision.pool if self._wake is None else await self._wake(decision.pool, may_use)
        if target == decision.pool:
            return decision
        why = f"{decision.pool!r} is starting on demand"
        return moved(loaded.policy, decision, "on-demand-fallback", target, why,
                     f"{why}: served by {target!r} meanwhile")

    async def _forward(self, upstream: dict[str, Any], request: ChatRequest, facts: RequestFacts,
                       loaded: LoadedPolicy, turn: CascadeTurn) -> JSONReply | StreamReply:
        """Send to the pool's version that takes the request (`PoolVersions.target`). A canary that fails the
        request before any byte reached the client (no replica could take it, or its engine answered 5xx) hands it
        to the pool's own version: a bad canary costs its guard's error budget, never a client's request."""
        decision, pool = self._versions.target(facts.decision, turn.raw)
        try:
            return await self._send(pool, dict(upstream, model=decision.model), request,
                                    replace(facts, decision=decision), loaded, turn)
        except (NoReplicaAvailable, UpstreamError) as exc:
            if not self._versions.on_canary(decision, pool) or exc.status < 500:
                raise
            log.warning("pool %s: its canary %s failed request %s (%s); the pool's own version serves it",
                        decision.pool, decision.pool_version, facts.request_id, exc.message)
            routed = replace(facts.decision, route=decision.route)  # as routed, with the canary's step
            decision, pool = self._versions.own(routed.then(
                "canary-fallback", f"its canary {decision.pool_version} failed before any byte"))
            return await self._send(pool, upstream, request, replace(facts, decision=decision), loaded, turn)

    async def _send(self, pool: Pool, upstream: dict[str, Any], request: ChatRequest, facts: RequestFacts,
                    loaded: LoadedPolicy, turn: CascadeTurn) -> JSONReply | StreamReply:
        """`turn.headers`: the ladder's response headers for this pool; force_stream only from steps acting on it."""
        extra, chat = turn.headers, turn.native is None  # the cascade and force_stream read chat answers only
        if chat and cascades(loaded, facts.decision):
            return await self._cascade.run(pool, upstream, request, facts, loaded, turn)
        if translated(loaded, facts.decision.pool, turn.native):  # a Responses request for a chat-only pool
            return await send_via_chat(self._fw, pool, upstream, request, facts, loaded, extra)
        if request.stream:
            return await self._fw.stream(pool, upstream, request, facts, loaded, extra)
        if chat and turn.ladder.applying_to(facts.decision.pool).force_stream:
            return await self._fw.json_via_stream(pool, upstream, facts, loaded, extra)
        return await self._fw.json(pool, upstream, facts, loaded, extra)


async def _step(name: str, request_id: str, decision: RouteDecision,
                work: Awaitable[RouteDecision]) -> RouteDecision:
    """`work`, the route step `name` on `decision`. An error it raises names the step in its message, and the log
    has the route up to it (never the prompt: `policies.decide.RouteStep`)."""
    try:
        return await work
    except GatewayError as exc:
        log.info("request %s: route step %s refused it (%s) after route %s", request_id, name, exc.message,
                 route_text(decision.route) or "-")
        exc.message = f"{name}: {exc.message}"
        raise


def _upstream(turn: CascadeTurn, decision: RouteDecision, request: ChatRequest,
              ) -> tuple[dict[str, Any], dict[str, str]]:
    """The engine's body for `decision` and the ladder's response headers: the chat body, or the native body of
    a Responses or completions request."""
    if turn.native is None:
        return prepare_upstream(turn.raw, decision, request, turn.ladder)
    return native_upstream(turn.native, decision, request.stream, turn.ladder)


