"""Forward a routed request to its pool and account for it: the plain (non-cascade) paths.

`Forwarder` sends JSON requests, opens and relays streams, assembles a JSON answer from a stream (the
ladder's force_stream step), and records every finished call exactly once: cost ledger, metrics, the
degradation monitor's windows, and the replay log when enabled.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from backends.clients.pool import Pool, Replica
from backends.clients.shared import EngineClient
from gateway.checking.judge import CHECK_HEADER, OutputChecker, Rejection
from gateway.control.adaptation.degradation import DegradationMonitor
from gateway.errors import GatewayError, NoReplicaAvailable
from gateway.serving.openai.endpoints import CHAT, COMPLETIONS, ENDPOINTS, RESPONSES
from gateway.serving.openai.prompt_count import count_request_usage
from gateway.serving.openai.schema import ChatRequest
from gateway.serving.openai.usage import Usage, usage_from_json
from gateway.serving.records.accounting import Accountant, RequestFacts
from gateway.serving.records.request_log import RequestLog
from gateway.serving.sending.assemble import assemble_events, assemble_stream
from gateway.serving.sending.proxy import OpenStream, Proxy
from gateway.serving.sending.streaming import (
    CHAT_STREAM,
    COMPLETIONS_STREAM,
    RESPONSES_STREAM,
    StreamFormat,
    StreamRelay,
)
from gateway.telemetry.metrics import GatewayMetrics
from policies.decide import RouteDecision
from policies.loader import LoadedPolicy

__all__ = ["Forwarder", "JSONReply", "OutcomeHook", "Recording", "StreamReply"]

OutcomeHook = Callable[[str, str, "float | None", bool], None]
"""(pool, engine version, TTFT seconds or None, failed) of every call that ended: the canary guard's feed."""

log = logging.getLogger("cascade.forward")
_STREAM_FORMATS: dict[str, StreamFormat] = {CHAT.name: CHAT_STREAM, COMPLETIONS.name: COMPLETIONS_STREAM,
                                            RESPONSES.name: RESPONSES_STREAM}


@dataclass(frozen=True, slots=True)
class JSONReply:
    """`rejected`: the output check's verdict on an answer it replaces (`Forwarder.judged`); the output check layer
    (`gateway.serving.sending.answer_check`) answers again, and a rejected reply never reaches the client."""

    body: bytes
    decision: RouteDecision
    headers: dict[str, str] = field(default_factory=dict)
    rejected: Rejection | None = None


@dataclass(frozen=True, slots=True)
class StreamReply:
    relay: StreamRelay
    decision: RouteDecision
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Recording:
    """Where every finished call is told: the cost ledger (`accountant`), the degradation monitor's windows, the
    replay log when enabled, and `on_outcome` (the canary guard's feed)."""

    accountant: Accountant
    degradation: DegradationMonitor
    request_log: RequestLog | None = None
    on_outcome: OutcomeHook | None = None


class Forwarder:
    """Shares, does not own, its collaborators."""

    def __init__(self, proxy: Proxy, engines: EngineClient, recording: Recording, metrics: GatewayMetrics,
                 checker: OutputChecker | None = None) -> None:
        """`checker` judges every answer (`gateway.checking`; None: no output checks)."""
        self.proxy = proxy
        self.checker = checker
        self._on_outcome = recording.on_outcome
        self._engines = engines
        self._accountant = recording.accountant
        self._metrics = metrics
        self._degradation = recording.degradation
        self._log = recording.request_log

    @property
    def engines(self) -> EngineClient:
        """The engine client it forwards with (also what counts tokens at the engines)."""
        return self._engines

    async def complete(self, pool: Pool, body: bytes, path: str = CHAT.path,
                       started: float | None = None) -> tuple[Replica, bytes]:
        """A non-streamed call. `started` (the request's arrival, monotonic seconds): observe the time to the
        engine's answer into `cascade_first_byte_seconds` (`gateway.telemetry.metrics` says why not TTFT)."""
        try:
            answered = await self.proxy.complete(pool, body, path)
        except GatewayError as exc:
            self._note_failure(pool, exc)
            raise
        if started is not None:
            self._metrics.first_byte.labels(pool.name, pool.version or "none").observe(time.monotonic() - started)
        return answered

    async def open(self, pool: Pool, body: bytes, path: str = CHAT.path) -> OpenStream:
        try:
            return await self.proxy.open_stream(pool, body, path)
        except GatewayError as exc:
            self._note_failure(pool, exc)
            raise

    def _note_failure(self, pool: Pool, exc: GatewayError) -> None:
        if isinstance(exc, NoReplicaAvailable) or exc.status >= 500:
            self._degradation.observe(pool.name, error=True)
            if self._on_outcome is not None:
                self._on_outcome(pool.name, pool.version, None, True)

    async def json(self, pool: Pool, upstream: dict[str, Any], facts: RequestFacts, loaded: LoadedPolicy,
                   headers: dict[str, str] | None = None) -> JSONReply:
        replica, body = await self.complete(pool, orjson.dumps(upstream), ENDPOINTS[facts.endpoint].path,
                                            facts.started)
        try:
            answer: dict[str, Any] | None = orjson.loads(body)  # once, for the checks and the usage
        except orjson.JSONDecodeError:
            answer = None
        facts, checked, rejected = self.judged(loaded, facts, replica, upstream, body, answer)
        if rejected is None:
            self.account_json(loaded, facts, replica, upstream, body, answer)
        return JSONReply(body, facts.decision, {**(headers or {}), **checked}, rejected)

    def judged(self, loaded: LoadedPolicy, facts: RequestFacts, replica: Replica, upstream: dict[str, Any],
               body: bytes, answer: dict[str, Any] | None = None, usage: Usage | None = None,
               ) -> tuple[RequestFacts, dict[str, str], Rejection | None]:
        """Run the output checks on a JSON answer about to be served (`answer`: its parsed `body`, when known).
        Returns the facts to record it with (the verdict in `output_check`), its response headers, and a
        `Rejection` when a failed check asks for an action that `facts.redo` still allows (escalation only from the
        micro pool: there is no pool up from the others): the answer is then recorded as discarded here, and the
        caller neither records nor serves it."""
        if self.checker is None or facts.status != "ok" or not ENDPOINTS[facts.endpoint].checks:
            return facts, {}, None
        try:
            answer = orjson.loads(body) if answer is None else answer
        except orjson.JSONDecodeError:
            return facts, {}, None
        verdict = self.checker.judge(loaded.policy, facts.tenant, facts.decision, upstream, answer)
        if not verdict.results:
            return facts, {}, None
        facts = replace(facts, output_check=verdict.summary)
        action = verdict.action
        redo = facts.redo if facts.decision.pool == loaded.policy.routing.micro_pool else (
            tuple(a for a in facts.redo if a != "escalate"))
        if action is not None and action in redo:
            dropped = replace(facts, request_id=facts.request_id + "-check", status="discarded")
            self._accountant.spawn(self._record(loaded, dropped, replica, upstream, usage_from_json(answer)
                                                if usage is None else usage, ""))
            return facts, {CHECK_HEADER: verdict.header}, Rejection(action, verdict)
        if action is not None:
            self.checker.acted(facts.decision.pool, verdict, "flagged" if action == "flag" else "held")
        return facts, {CHECK_HEADER: verdict.header}, None

    async def json_via_stream(self, pool: Pool, upstream: dict[str, Any], facts: RequestFacts, loaded: LoadedPolicy,
                              headers: dict[str, str]) -> JSONReply:
        """Stream from the engine, answer the client in one JSON body: the body the engine would have sent
        (every choice, tool calls, logprobs, usage; `gateway.serving.sending.assemble`), with TTFT observed and the
        engine's read timeout applying between chunks rather than to the whole answer."""
        body = dict(upstream, stream=True, stream_options={"include_usage": True})
        opened = await self.open(pool, orjson.dumps(body))
        async with opened.upstream:
            answer, usage, ttft_s = await assemble_stream(opened, facts.started)
        facts = replace(facts, ttft_s=ttft_s)
        served = orjson.dumps(answer)
        facts, checked, rejected = self.judged(loaded, facts, opened.replica, upstream, served, answer, usage)
        if rejected is None:
            self._accountant.spawn(self._record(loaded, facts, opened.replica, upstream, usage, ""))
        return JSONReply(served, facts.decision, {**headers, **checked}, rejected)

    async def stream(self, pool: Pool, upstream: dict[str, Any], request: ChatRequest, facts: RequestFacts,
                     loaded: LoadedPolicy, headers: dict[str, str] | None = None) -> StreamReply:
        opened = await self.open(pool, orjson.dumps(upstream), ENDPOINTS[facts.endpoint].path)
        return self.relay(opened, opened.first_chunk, upstream, request, facts, loaded, headers)

    def relay(self, opened: OpenStream, first: bytes, upstream: dict[str, Any], request: ChatRequest,
              facts: RequestFacts, loaded: LoadedPolicy, headers: dict[str, str] | None = None) -> StreamReply:
        def judge(relay: StreamRelay) -> None:  # first: the record and the cache read the verdict
            relay.output_check = self._judge_stream(loaded, facts, upstream, relay)

        def record(relay: StreamRelay) -> None:
            self._accountant.spawn(self._account_stream(loaded, facts, opened.replica, upstream, relay))

        relay = StreamRelay(first, opened.chunks, opened.upstream, request.wants_usage_chunk, facts.started, judge)
        relay.add_finish_callback(record)
        relay.fmt = _STREAM_FORMATS[facts.endpoint]
        return StreamReply(relay, facts.decision, headers or {})

    def account_json(self, loaded: LoadedPolicy, facts: RequestFacts, replica: Replica, upstream: dict[str, Any],
                     body: bytes, answer: dict[str, Any] | None = None) -> None:
        """Record a JSON answer `body` (`answer`: `body` parsed, when the caller has it)."""
        try:
            usage = usage_from_json(orjson.loads(body) if answer is None else answer)
        except orjson.JSONDecodeError:
            usage = None
        self._accountant.spawn(self._record(loaded, facts, replica, upstream, usage, ""))

    def account_partial(self, loaded: LoadedPolicy, facts: RequestFacts, replica: Replica,
                        upstream: dict[str, Any], text: str, tokens_seen: int) -> None:
        """A call cut short by the gateway (a cascade probe): count what was generated. `tokens_seen` (the
        tokens the gateway read, one logprob entry each) is the least an estimated count may charge: 4
        characters a token undercounts short tokens."""
        self._accountant.spawn(self._record(loaded, facts, replica, upstream, None, text, tokens_seen))

    async def _record(self, loaded: LoadedPolicy, facts: RequestFacts, replica: Replica, upstream: dict[str, Any],
                      usage: Usage | None, text: str, tokens_seen: int = 0) -> None:
        if usage is None:
            usage = await count_request_usage(facts.endpoint, loaded.policy.pools.get(facts.decision.pool),
                                              self._engines, replica.url, facts.decision.model, upstream, text)
            if usage.source == "estimate" and usage.completion_tokens < tokens_seen:
                usage = replace(usage, completion_tokens=tokens_seen)
        rec = await self._accountant.record(loaded.policy, facts, usage)
        self._degradation.observe(rec.pool, facts.ttft_s, error=rec.status == "upstream_error")
        if self._on_outcome is not None and rec.status != "escalated":
            self._on_outcome(rec.pool, rec.pool_version, facts.ttft_s, rec.status == "upstream_error")
        if self._log is not None and facts.request is not None:
            self._log.write(facts, rec)

    def _judge_stream(self, loaded: LoadedPolicy, facts: RequestFacts, upstream: dict[str, Any],
                      relay: StreamRelay) -> str:
        """The output checks' verdict (`Verdict.summary`) on a whole streamed chat answer: judged, never replaced
        (it has left); "" when nothing judged it."""
        if not relay.completed or self.checker is None or not ENDPOINTS[facts.endpoint].checks:
            return ""
        verdict = self.checker.judge(loaded.policy, facts.tenant, facts.decision, upstream,
                                     assemble_events(relay.events).answer())
        if verdict.action is not None:
            self.checker.acted(facts.decision.pool, verdict, "flagged")
        return verdict.summary

    async def _account_stream(self, loaded: LoadedPolicy, facts: RequestFacts, replica: Replica,
                              upstream: dict[str, Any], relay: StreamRelay) -> None:
        status = "ok" if relay.completed else ("client_disconnect" if relay.disconnected else "upstream_error")
        facts = replace(facts, ttft_s=relay.ttft_s, status=status, output_check=relay.output_check)
        text = relay.generated_text() if relay.usage is None else ""
        await self._record(loaded, facts, replica, upstream, relay.usage, text)
        itl = self._metrics.itl.labels(facts.decision.pool, facts.decision.pool_version or "none")
        for gap in relay.gaps_s:  # one per content event, timed per network chunk (`StreamRelay._content_arrived`)
            itl.observe(gap)
