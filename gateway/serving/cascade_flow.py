"""The cascade's request flow: micro first with logprobs, keep the answer if confident, else escalate.

Escalation happens before any byte reaches the client. The discarded micro call is recorded under
`<request id>-probe` with status "escalated"; the flagship call under the request id.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import orjson

from backends.pool import Pool
from gateway.serving.accounting import RequestFacts
from gateway.serving.cascade import answer_logprobs, cascade_headers, confidence, probe_stream, without_logprobs
from gateway.serving.forwarding import Forwarder, JSONReply, StreamReply
from gateway.serving.schema import ChatRequest
from policies.decide import RouteDecision, served_model
from policies.loader import LoadedPolicy

__all__ = ["CascadeFlow", "cascades"]


def cascades(loaded: LoadedPolicy, decision: RouteDecision) -> bool:
    """The cascade applies to requests the score sent to the micro pool, when the policy enables it."""
    routing = loaded.policy.routing
    return routing.cascade.enabled and decision.score is not None and decision.pool == routing.micro_pool


class CascadeFlow:
    def __init__(self, forwarder: Forwarder, pool_of: Callable[[str], Pool]) -> None:
        self._fw = forwarder
        self._pool_of = pool_of

    async def run(self, pool: Pool, upstream: dict[str, Any], request: ChatRequest, facts: RequestFacts,
                  loaded: LoadedPolicy) -> JSONReply | StreamReply:
        cfg = loaded.policy.routing.cascade
        body = orjson.dumps({**upstream, "logprobs": True})
        probe_facts = replace(facts, request_id=facts.request_id + "-probe", status="escalated")
        if request.stream:
            opened = await self._fw.open(pool, body)
            try:
                probe = await probe_stream(opened, cfg.first_tokens)
            except BaseException:
                await opened.upstream.aclose()
                raise
            conf = confidence(probe.logprobs)
            if conf is None or conf >= cfg.min_confidence:
                headers = cascade_headers(False, conf)
                return self._fw.relay(opened, probe.held, upstream, request, facts, loaded, headers)
            await opened.upstream.aclose()  # aborts the micro request on the engine
            self._fw.account_partial(loaded, probe_facts, opened.replica, upstream, probe.text)
        else:
            replica, answer = await self._fw.complete(pool, body)
            conf = confidence(answer_logprobs(answer))
            if conf is None or conf >= cfg.min_confidence:
                self._fw.account_json(loaded, facts, replica, upstream, answer)
                answer = answer if request.logprobs else without_logprobs(answer)
                return JSONReply(answer, facts.decision, cascade_headers(False, conf))
            self._fw.account_json(loaded, probe_facts, replica, upstream, answer)
        return await self._escalate(upstream, request, facts, loaded, conf)

    async def _escalate(self, upstream: dict[str, Any], request: ChatRequest, facts: RequestFacts,
                        loaded: LoadedPolicy, conf: float) -> JSONReply | StreamReply:
        policy = loaded.policy
        target = policy.routing.flagship_pool
        reason = f"micro answer confidence {conf:.3f} < {policy.routing.cascade.min_confidence}: escalated"
        model = served_model(policy, target)
        facts = replace(facts, decision=replace(facts.decision, pool=target, model=model, rule="cascade",
                                                reason=reason))
        upstream = dict(upstream, model=model)
        headers = cascade_headers(True, conf)
        if request.stream:
            return await self._fw.stream(self._pool_of(target), upstream, request, facts, loaded, headers)
        return await self._fw.json(self._pool_of(target), upstream, facts, loaded, headers)
