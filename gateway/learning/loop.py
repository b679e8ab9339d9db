"""What the gateway keeps of each answered request for the router to learn from (policy `learning:`).

`LearningTap.observe` is called once per answered chat request, after the reply is built and before it is
sent. It decides (policy `learning.keep_prompts.sample`) whether to keep the request; a kept request gets,
in the background (tracked by the `Accountant`, so shutdown waits for it):

- its prompt record (`LabelKeys.prompt`): the text and the conversation's shape the scorer saw (a retrain from
  the ledger reads both), the score, the answering pool, the tenant, the time, living `keep_prompts.ttl_days`;
- for a true-cascade request, the micro answer's confidence and whether it escalated (`LabelKeys.cascade`);
- with probability `learning.shadow.sample`, when the micro pool answered in full, a shadow comparison
  (`gateway.learning.shadow`), started once the client's answer is whole: a JSON answer when it is built (sending it
  does not wait for the comparison), a stream when the client has read all of it (a cut stream: none).

Both draws rise where traffic is unlike the router's training data: a request with in-domain figure d
(`RouteDecision.in_domain`) is kept, and compared, with the sample times `learning.in_domain.sampling_factor(d)`
(1 + (unlike_sampling - 1) * (1 - d), capped at probability 1; no figure: the sample as set), so labels arrive
first where the router's figures say least.

Only scored requests are kept (the loop teaches the scorer). Nothing here raises into the request: a Redis
failure is logged and the label is lost. Prompts are user data: the whole section is off by default.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

import orjson

from gateway.learning.shadow import ShadowComparison, answer_text
from gateway.learning.store import LearningStore
from gateway.serving.records.accounting import Accountant
from gateway.serving.sending.forwarding import JSONReply, StreamReply
from gateway.serving.sending.streaming import StreamRelay
from gateway.telemetry.metrics import GatewayMetrics
from policies.loader import LoadedPolicy
from router_models.serving.scorer import read_conversation
from router_models.training.ledger_labels import shape_fields

__all__ = ["LearningTap"]

log = logging.getLogger("cascade.learning")


class LearningTap:
    """Keeps sampled requests and their labels. Shares (does not own) every collaborator."""

    def __init__(self, store: LearningStore, accountant: Accountant, metrics: GatewayMetrics,
                 shadow: ShadowComparison | None, rng: Callable[[], float] = random.random) -> None:
        """`rng()` draws the keep and shadow samples (uniform in [0, 1); tests pass a fixed one)."""
        self._store = store
        self._accountant = accountant
        self._metrics = metrics
        self._shadow = shadow
        self._rng = rng

    def observe(self, reply: JSONReply | StreamReply, raw: Mapping[str, Any], tenant: str, request_id: str,
                loaded: LoadedPolicy) -> None:
        """Keep `request_id` when sampled; schedules background work only, returns at once."""
        policy = loaded.policy
        keep = policy.learning.keep_prompts
        decision = reply.decision
        factor = policy.learning.in_domain.sampling_factor(decision.in_domain)
        if decision.score is None or keep.sample <= 0 or self._rng() >= min(1.0, keep.sample * factor):
            return
        micro = decision.pool == policy.routing.micro_pool
        text, shape = read_conversation(raw["messages"])
        prompt = {"text": text, "score": repr(float(decision.score)), "pool": decision.pool,
                  "micro": "1" if micro else "0", "tenant": tenant, "at": repr(time.time()),
                  **shape_fields(shape)}
        writes = [(self._store.labels.prompt(request_id), prompt)]
        cascade = _cascade_label(reply.headers)
        if cascade is not None:
            writes.append((self._store.labels.cascade(request_id), cascade))
        self._spawn(self._write(writes, keep.ttl_days * 86_400))
        self._metrics.learning.labels("prompt_kept").inc()
        shadow = policy.learning.shadow
        if micro and self._shadow is not None and shadow.sample > 0 and self._rng() < min(1.0, shadow.sample * factor):
            self._after_answer(reply, lambda answer: self._compare(request_id, raw, answer, loaded))

    def _after_answer(self, reply: JSONReply | StreamReply,
                      work: Callable[[str], Coroutine[Any, Any, None]]) -> None:
        """Run `work(answer text)` once the client's answer is complete (a stream: only if it completed)."""
        if isinstance(reply, JSONReply):
            try:
                answer = answer_text(orjson.loads(reply.body))
            except ValueError:
                return
            self._spawn(work(answer))
            return

        def finished(relay: StreamRelay) -> None:
            if relay.completed and relay.error is None:
                self._spawn(work(relay.generated_text()))

        reply.relay.add_finish_callback(finished)

    async def _compare(self, request_id: str, raw: Mapping[str, Any], answer: str, loaded: LoadedPolicy) -> None:
        assert self._shadow is not None
        try:
            await self._shadow.compare(request_id, raw, answer, loaded)
        except Exception:  # Redis down or a bug: the comparison is lost, never the request
            log.exception("shadow comparison failed", extra={"request_id": request_id})

    async def _write(self, writes: list[tuple[str, dict[str, str]]], ttl_s: int) -> None:
        try:
            for key, fields in writes:
                await self._store.put(key, fields, ttl_s)
        except Exception:
            log.exception("learning record not stored", extra={"key": writes[0][0]})

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        self._accountant.spawn(work)


def _cascade_label(headers: Mapping[str, str]) -> dict[str, str] | None:
    """The true cascade's weak label from its reply headers (`gateway.serving.sending.cascade.cascade_headers`)."""
    escalated = headers.get("x-cascade-escalated")
    if escalated not in ("true", "false"):
        return None
    confidence = headers.get("x-cascade-confidence", "none")
    return {"confidence": "" if confidence == "none" else confidence, "escalated": "1" if escalated == "true" else "0",
            "at": repr(time.time())}
