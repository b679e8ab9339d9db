"""The chat-completions service: score → route → proxy (or stream) → account.

HTTP-free: it takes a validated `ChatRequest` and returns a reply for `gateway.app` to render.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from backends.engine_client import EngineClient
from backends.pool import Pool, Replica
from gateway.accounting import Accountant, RequestFacts
from gateway.cascade import answer_logprobs, confidence, probe_stream
from gateway.errors import BadRequest, ModelNotFound, NoReplicaAvailable
from gateway.metrics import GatewayMetrics
from gateway.policy_holder import PolicyHolder
from gateway.proxy import OpenStream, Proxy
from gateway.schema import ChatRequest
from gateway.streaming import StreamRelay
from gateway.usage import Usage, count_usage, usage_from_json
from policies.decide import AUTO_MODEL, RouteContext, RouteDecision, decide, needs_score, pinned_pool, served_model
from policies.loader import LoadedPolicy
from router_models.scorer import Scorer, conversation_text

__all__ = ["ChatService", "JSONReply", "StreamReply"]

log = logging.getLogger("cascade.service")


@dataclass(frozen=True, slots=True)
class JSONReply:
    body: bytes
    decision: RouteDecision
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StreamReply:
    relay: StreamRelay
    decision: RouteDecision
    headers: dict[str, str] = field(default_factory=dict)


class ChatService:
    """Handles one chat request end to end. Shares, but does not own, its collaborators."""

    def __init__(
        self,
        policies: PolicyHolder,
        pools: dict[str, Pool],
        scorer: Scorer | None,
        proxy: Proxy,
        engines: EngineClient,
        accountant: Accountant,
        metrics: GatewayMetrics,
    ) -> None:
        self._policies = policies
        self._pools = pools
        self._scorer = scorer
        self._proxy = proxy
        self._engines = engines
        self._accountant = accountant
        self._metrics = metrics

    async def route(self, request: ChatRequest, tenant: str, loaded: LoadedPolicy) -> RouteDecision:
        policy = loaded.policy
        if request.model != AUTO_MODEL and pinned_pool(policy, request.model) is None:
            names = sorted({AUTO_MODEL, *policy.pools, *policy.aliases})
            raise ModelNotFound(
                f"model {request.model!r} is not served here; use one of {names}", param="model"
            )
        messages = [m.model_dump(exclude_none=True) for m in request.messages]
        ctx = RouteContext(tenant, request.model, conversation_text(messages))
        score: float | None = None
        if self._scorer is not None and needs_score(policy, ctx):
            try:
                began = time.monotonic()
                score = (await self._scorer.score([ctx.prompt_text]))[0]
                self._metrics.scoring.observe(time.monotonic() - began)
            except Exception:
                log.exception("scoring failed; sending to the flagship pool")
                pool = policy.routing.flagship_pool
                return decide(policy, loaded.version, RouteContext(tenant, pool, ctx.prompt_text), None)
        return decide(policy, loaded.version, ctx, score)

    def _pool(self, name: str) -> Pool:
        pool = self._pools.get(name)
        if pool is None:
            raise NoReplicaAvailable(f"pool {name!r} has no running replicas")
        return pool

    async def handle(
        self, request: ChatRequest, raw: dict[str, Any], tenant: str, request_id: str
    ) -> JSONReply | StreamReply:
        started, started_wall = time.monotonic(), time.time()
        loaded = self._policies.current
        decision = await self.route(request, tenant, loaded)
        _check_limits(loaded, decision, request)
        upstream = dict(raw, model=decision.model)
        facts = RequestFacts(request_id, tenant, decision, started_wall, started, None, "ok")
        pool = self._pool(decision.pool)
        self._metrics.overhead.observe(time.monotonic() - started)
        if request.stream:
            upstream["stream_options"] = {**(raw.get("stream_options") or {}), "include_usage": True}
        if _cascades(loaded, decision):
            return await self._cascade(pool, upstream, request, facts, loaded)
        if request.stream:
            opened = await self._proxy.open_stream(pool, orjson.dumps(upstream))
            return self._relay(opened, opened.first_chunk, upstream, request, facts, loaded)
        replica, body = await self._proxy.complete(pool, orjson.dumps(upstream))
        self._accountant.spawn(self._account_json(loaded, facts, replica, raw, body))
        return JSONReply(body, decision)

    def _relay(
        self, opened: OpenStream, first: bytes, upstream: dict[str, Any], request: ChatRequest,
        facts: RequestFacts, loaded: LoadedPolicy, headers: dict[str, str] | None = None,
    ) -> StreamReply:
        def on_finish(relay: StreamRelay) -> None:
            self._accountant.spawn(self._account_stream(loaded, facts, opened.replica, upstream, relay))

        relay = StreamRelay(first, opened.chunks, opened.upstream, request.wants_usage_chunk, facts.started, on_finish)
        return StreamReply(relay, facts.decision, headers or {})

    async def _cascade(
        self, pool: Pool, upstream: dict[str, Any], request: ChatRequest, facts: RequestFacts, loaded: LoadedPolicy
    ) -> JSONReply | StreamReply:
        """Micro first with logprobs; keep its answer if confident, else escalate to the flagship."""
        cfg = loaded.policy.routing.cascade
        probe_body = orjson.dumps({**upstream, "logprobs": True})
        if request.stream:
            opened = await self._proxy.open_stream(pool, probe_body)
            try:
                probe = await probe_stream(opened, cfg.first_tokens)
            except BaseException:
                await opened.upstream.aclose()
                raise
            conf = confidence(probe.logprobs)
            if conf is None or conf >= cfg.min_confidence:
                return self._relay(opened, probe.held, upstream, request, facts, loaded, _cascade_headers(False, conf))
            await opened.upstream.aclose()  # aborts the micro request on the engine
            self._accountant.spawn(self._account_probe(loaded, facts, opened.replica, upstream, probe.text))
        else:
            replica, body = await self._proxy.complete(pool, probe_body)
            conf = confidence(answer_logprobs(body))
            if conf is None or conf >= cfg.min_confidence:
                self._accountant.spawn(self._account_json(loaded, facts, replica, upstream, body))
                body = body if request.logprobs else _without_logprobs(body)
                return JSONReply(body, facts.decision, _cascade_headers(False, conf))
            probe_facts = replace(facts, request_id=facts.request_id + "-probe", status="escalated")
            self._accountant.spawn(self._account_json(loaded, probe_facts, replica, upstream, body))
        return await self._escalate(upstream, request, facts, loaded, conf)

    async def _escalate(
        self, upstream: dict[str, Any], request: ChatRequest, facts: RequestFacts, loaded: LoadedPolicy,
        conf: float,
    ) -> JSONReply | StreamReply:
        policy = loaded.policy
        cfg = policy.routing.cascade
        target = policy.routing.flagship_pool
        reason = f"micro answer confidence {conf:.3f} < {cfg.min_confidence}: escalated to {target!r}"
        model = served_model(policy, target)
        decision = replace(facts.decision, pool=target, model=model, rule="cascade", reason=reason)
        facts = replace(facts, decision=decision)
        upstream = dict(upstream, model=decision.model)
        headers = _cascade_headers(True, conf)
        if request.stream:
            opened = await self._proxy.open_stream(self._pool(target), orjson.dumps(upstream))
            return self._relay(opened, opened.first_chunk, upstream, request, facts, loaded, headers)
        replica, body = await self._proxy.complete(self._pool(target), orjson.dumps(upstream))
        self._accountant.spawn(self._account_json(loaded, facts, replica, upstream, body))
        return JSONReply(body, decision, headers)

    async def _account_probe(
        self, loaded: LoadedPolicy, facts: RequestFacts, replica: Replica, upstream: dict[str, Any], text: str
    ) -> None:
        usage = await count_usage(self._engines, replica.url, facts.decision.model, upstream["messages"], text)
        probe_facts = replace(facts, request_id=facts.request_id + "-probe", status="escalated")
        await self._accountant.record(loaded.policy, probe_facts, usage)

    async def _account_json(
        self, loaded: LoadedPolicy, facts: RequestFacts, replica: Replica, raw: dict[str, Any], body: bytes
    ) -> None:
        try:
            usage = usage_from_json(orjson.loads(body))
        except orjson.JSONDecodeError:
            usage = None
        if usage is None:
            usage = await count_usage(self._engines, replica.url, facts.decision.model, raw["messages"], "")
        await self._accountant.record(loaded.policy, facts, usage)

    async def _account_stream(
        self, loaded: LoadedPolicy, facts: RequestFacts, replica: Replica, upstream: dict[str, Any], relay: StreamRelay
    ) -> None:
        usage: Usage | None = relay.usage
        if usage is None:
            usage = await count_usage(
                self._engines, replica.url, facts.decision.model, upstream["messages"], relay.generated_text()
            )
        status = "ok" if relay.completed else ("client_disconnect" if relay.disconnected else "upstream_error")
        ended = RequestFacts(
            facts.request_id, facts.tenant, facts.decision, facts.started_wall, facts.started, relay.ttft_s, status
        )
        rec = await self._accountant.record(loaded.policy, ended, usage)
        itl = self._metrics.itl.labels(rec.pool)
        for gap in relay.gaps_s:
            itl.observe(gap)
        log.info(
            "stream finished",
            extra={"request_id": rec.request_id, "pool": rec.pool, "status": status,
                   "prompt_tokens": rec.prompt_tokens, "completion_tokens": rec.completion_tokens},
        )


def _cascades(loaded: LoadedPolicy, decision: RouteDecision) -> bool:
    """The cascade applies to requests the score sent to the micro pool, when the policy enables it."""
    routing = loaded.policy.routing
    return routing.cascade.enabled and decision.score is not None and decision.pool == routing.micro_pool


def _cascade_headers(escalated: bool, conf: float | None) -> dict[str, str]:
    shown = "none" if conf is None else f"{conf:.4f}"
    return {"x-cascade-escalated": "true" if escalated else "false", "x-cascade-confidence": shown}


def _without_logprobs(body: bytes) -> bytes:
    """Drop the logprobs the cascade asked for from an answer whose client did not ask for them."""
    try:
        answer = orjson.loads(body)
        for choice in answer.get("choices") or ():
            choice["logprobs"] = None
        return orjson.dumps(answer)
    except (orjson.JSONDecodeError, AttributeError, TypeError):
        return body


def _check_limits(loaded: LoadedPolicy, decision: RouteDecision, request: ChatRequest) -> None:
    spec = loaded.policy.pools[decision.pool]
    limit = request.completion_limit
    if spec.type == "local" and limit is not None and limit >= spec.engine.max_model_len:
        field = "max_completion_tokens" if request.max_completion_tokens else "max_tokens"
        raise BadRequest(
            f"{field}={limit} does not fit pool {decision.pool!r}: its context is "
            f"{spec.engine.max_model_len} tokens including the prompt",
            param=field,
            code="context_length_exceeded",
        )
