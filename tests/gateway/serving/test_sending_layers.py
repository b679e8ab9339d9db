"""Route steps and sending layers in-process, over fakes: the step loop names a refusing step and takes a new step as
one more item; the canary layer hands a failed canary's call to the pool's own version; the output check layer sends
a rejected answer again once, or serves it flagged when the resend cannot be had."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from gateway.checking.judge import ACTION_HEADER, CHECK_HEADER, Rejection, Verdict
from gateway.control.fleet.canaries import CanaryRoute
from gateway.errors import BadRequest, NoReplicaAvailable, UpstreamError
from gateway.serving.openai.schema import parse_chat_request
from gateway.serving.records.accounting import RequestFacts
from gateway.serving.routing.request_context import BatchTag, RequestContext
from gateway.serving.routing.versions import PoolVersions
from gateway.serving.sending.answer_check import OutputCheckLayer
from gateway.serving.sending.calls import Call
from gateway.serving.sending.forwarding import JSONReply, StreamReply
from gateway.serving.sending.layers import CanaryLayer
from gateway.serving.steps import Planner, Step
from policies.decide import RouteDecision, RouteStep, moved
from policies.ladder import LadderState
from policies.loader import parse_policy
from tests.conftest import policy_yaml

LOADED = parse_policy(policy_yaml("http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1"))
SCORED = RouteDecision("micro", "micro-model", 0.2, "threshold", "scored low", LOADED.version,
                       route=(RouteStep("score", "micro", "0.20 < 0.50"),))


def _ctx() -> RequestContext:
    request, raw = parse_chat_request(orjson.dumps({"model": "auto", "messages": [{"role": "user", "content": "hi"}]}))
    return RequestContext(request, raw, "default", "req_1", LOADED, LadderState())


def _call(decision: RouteDecision = SCORED) -> Call:
    return Call(RequestFacts("req_1", "default", decision, 0.0, 0.0, None, "ok", redo=("retry",)),
                {"model": decision.model}, {"x-ladder": "none"})


class _Calls:
    """`gateway.serving.sending.calls.Calls` without limits or a budget: every hold is granted unless `holds` is
    False."""

    def __init__(self, holds: bool = True) -> None:
        self.holds, self.given_back = holds, 0

    async def prepare(self, ctx: RequestContext, facts: RequestFacts, decision: RouteDecision) -> Call:
        return Call(replace(facts, decision=decision), {"model": decision.model}, {"x-ladder": "none"})

    async def hold_again(self, ctx: RequestContext, call: Call) -> bool:
        return self.holds

    async def give_back_hold(self, ctx: RequestContext) -> None:
        self.given_back += 1


class _Engine:
    """A fake innermost layer: answers each call with `answers`' next item (a reply body, or an error to raise)."""

    def __init__(self, *answers: bytes | Exception, rejected: Rejection | None = None) -> None:
        self.answers, self.calls, self.rejected = list(answers), list[Call](), rejected

    async def send(self, ctx: RequestContext, call: Call) -> JSONReply | StreamReply:
        self.calls.append(call)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        rejected = self.rejected if len(self.calls) == 1 else None
        return JSONReply(answer, call.decision, dict(call.headers), rejected)


def _planner(*steps: Step, **more: Any) -> Planner:
    async def admit(*_: Any) -> None:
        return None

    async def route(*_: Any) -> RouteDecision:
        return SCORED

    async def place(_: Any, decision: RouteDecision, *__: Any) -> RouteDecision:
        return decision

    parts = SimpleNamespace(admission=SimpleNamespace(admit=admit), router=SimpleNamespace(route=route), wake=None,
                            forwarder=SimpleNamespace(checker=None), fit=SimpleNamespace(place=place),
                            keep_requests=False, **{"lane": None, **more})
    planner = Planner(parts, _Calls())  # type: ignore[arg-type]
    planner.steps = (*planner.steps, *steps)
    return planner


def test_a_step_is_one_more_item_and_a_refusing_step_is_named() -> None:
    async def to_flagship(ctx: RequestContext, decision: RouteDecision) -> RouteDecision:
        return moved(ctx.loaded.policy, decision, "to-flagship", "flagship", "a test step", "moved by a test step")

    async def refuse(ctx: RequestContext, decision: RouteDecision) -> RouteDecision:
        raise BadRequest("too big")

    planner = _planner(Step("to-flagship", to_flagship))
    assert [s.name for s in planner.steps] == ["on-demand-fallback", "json-guard", "context-fit", "batch-lane",
                                             "to-flagship"]
    _, call = asyncio.run(planner.plan(_ctx()))
    assert [str(s) for s in call.decision.route] == ["score:micro", "to-flagship:flagship"]
    assert (call.decision.pool, call.facts.request_id) == ("flagship", "req_1")
    assert call.upstream["model"] == "flagship-model"
    with pytest.raises(BadRequest) as refused:
        asyncio.run(_planner(Step("refuse", refuse)).plan(_ctx()))
    assert refused.value.message == "refuse: too big"  # the message the client's error body says


def test_a_batch_line_waits_in_the_lane_and_wakes_no_sleeping_pool_unless_the_policy_lets_it() -> None:
    entered: list[tuple[str, str]] = []
    arrived: list[str] = []

    class Lane:
        async def enter(self, loaded: Any, pool: str, request_id: str) -> None:
            entered.append((pool, request_id))

        async def arrived(self, loaded: Any, pool: str) -> None:
            arrived.append(pool)

    line = replace(_ctx(), batch=BatchTag("batch_1", "line-1"))
    planner = _planner(lane=Lane(), sleeping=lambda pool: pool == "flagship")
    _, call = asyncio.run(planner.plan(line))
    assert entered == [("micro", "req_1")]  # routed, then the lane: the pool stays
    assert (call.facts.batch_id, call.facts.custom_id) == ("batch_1", "line-1")
    asyncio.run(planner.plan(_ctx()))
    assert len(entered) == 1 and arrived == ["micro"]  # an interactive request never waits: the lane is told of it
    asleep = _planner(lane=Lane(), sleeping=lambda pool: True)
    with pytest.raises(NoReplicaAvailable) as refused:
        asyncio.run(asleep.plan(line))
    assert refused.value.code == "pool_asleep" and refused.value.message.startswith("on-demand-fallback: ")
    woken = parse_policy(policy_yaml("http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1",
                                     "batches: {wake_on_demand: true}\n"))
    asyncio.run(asleep.plan(replace(line, loaded=woken)))  # allowed: the wake (none here) serves it


def _versions() -> tuple[PoolVersions, Any, Any]:
    own, canary = SimpleNamespace(version="v1", ready=True), SimpleNamespace(version="v2", ready=True)
    route = CanaryRoute(canary, "v2", "micro-v2", 1.0, None)  # type: ignore[arg-type]
    return PoolVersions({"micro": own}, {"micro": route}), own, canary  # type: ignore[dict-item]


@pytest.mark.parametrize(("error", "falls_back"), [(UpstreamError("engine down", 502), True),
                                                  (NoReplicaAvailable("none ready"), True),
                                                  (UpstreamError("bad request", 400), False)])
def test_a_canary_that_fails_before_any_byte_hands_the_call_to_the_pools_own_version(
        error: Exception, falls_back: bool) -> None:
    versions, own, canary = _versions()
    engine = _Engine(error, b"{}")
    if not falls_back:
        with pytest.raises(UpstreamError):
            asyncio.run(CanaryLayer(SimpleNamespace(versions=versions), engine).send(_ctx(), _call()))  # type: ignore[arg-type]
        assert [c.pool for c in engine.calls] == [canary]
        return
    reply = asyncio.run(CanaryLayer(SimpleNamespace(versions=versions), engine).send(_ctx(), _call()))  # type: ignore[arg-type]
    assert [c.pool for c in engine.calls] == [canary, own]
    assert engine.calls[0].upstream["model"] == "micro-v2" and engine.calls[1].upstream["model"] == "micro-model"
    assert [str(s) for s in reply.decision.route] == ["score:micro", "canary:micro", "canary-fallback:micro"]
    assert (reply.decision.pool_version, reply.decision.model) == ("v1", "micro-model")


class _Checker:
    def __init__(self) -> None:
        self.acted: list[tuple[str, str]] = []

    def acted_on(self, pool: str, verdict: Verdict, done: str) -> None:
        self.acted.append((pool, done))


EMPTY = Rejection("retry", Verdict({"empty": "fail"}, {"empty": "retry"}))


@pytest.mark.parametrize(("second", "holds", "action"), [(b'{"ok": 2}', True, "retried:empty"),
                                                         (NoReplicaAvailable("none ready"), True, "held:empty"),
                                                         (b'{"ok": 2}', False, "held:empty")])
def test_a_rejected_answer_is_sent_again_once_or_served_flagged(second: bytes | Exception, holds: bool,
                                                                action: str) -> None:
    engine, calls, checker = _Engine(b'{"first": 1}', second, rejected=EMPTY), _Calls(holds), _Checker()
    checker_api = SimpleNamespace(acted=checker.acted_on)
    reply = asyncio.run(OutputCheckLayer(engine, calls, checker_api).send(_ctx(), _call()))  # type: ignore[arg-type]
    assert reply.headers[ACTION_HEADER] == action and isinstance(reply, JSONReply) and reply.rejected is None
    sent_again = holds  # a resend the budget cannot hold is never made
    assert len(engine.calls) == (2 if sent_again else 1)
    if sent_again:
        again = engine.calls[1]
        assert again.facts.redo == () and str(again.decision.route[-1]) == "output-check:micro"
    if action.startswith("held"):
        assert reply.body == b'{"first": 1}' and reply.headers[CHECK_HEADER] == "empty=fail"
        assert calls.given_back == 1 and checker.acted == [("micro", "held")]
    else:
        assert reply.body == b'{"ok": 2}' and checker.acted == [("micro", "retried")]
