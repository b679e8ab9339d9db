"""Price a finished request and hand its `CostRecord` to the ledger.

Every request that reached an engine is recorded exactly once, whatever way it ended. Accounting runs
in tasks the gateway tracks (`Accountant.drain` waits for them at shutdown), never on the response path.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.ledger.store import MAX_ROUTE, CostRecord, Ledger
from gateway.serving.openai.usage import Usage
from gateway.serving.records.access_log import AccessLog
from gateway.serving.records.tracing import Tracing, step
from gateway.serving.routing.completion_limit import NO_LIMIT_SET, SetLimit
from gateway.telemetry.metrics import GatewayMetrics
from policies.batches import discounted
from policies.decide import RouteDecision, route_text
from policies.schema import Policy
from policies.tiers import estimates_text

__all__ = ["Accountant", "RequestFacts"]

log = logging.getLogger("cascade.accounting")


@dataclass(frozen=True, slots=True)
class RequestFacts:
    """What the gateway knows about a request when it ends."""

    request_id: str
    tenant: str
    decision: RouteDecision
    started_wall: float  # UTC epoch seconds
    started: float  # monotonic seconds
    ttft_s: float | None
    status: str
    request: Mapping[str, Any] | None = None  # the client's body, kept only when the replay log is on
    endpoint: str = "chat"  # the OpenAI endpoint asked: "chat", "responses", "completions" (`serving.openai.endpoints`)
    cache: str = ""  # the response cache's answer for the ledger: "", "miss" or "bypass" (`gateway.caching`)
    output_check: str = ""  # the output checks' verdict for the ledger (`gateway.checking.judge.Verdict.summary`)
    redo: tuple[str, ...] = ()  # what a failed output check may still do with this answer: "retry", "escalate"
    key_id: str = ""  # the caller's API key id (`gateway.tenancy.api_keys`)
    limit_set: SetLimit = NO_LIMIT_SET  # the completion limit the gateway set on this call
                                        # (`serving.routing.completion_limit`)
    batch_id: str = ""  # the batch this request is a line of (`gateway.batches`); "" for an interactive request
    custom_id: str = ""  # that line's custom_id


class Accountant:
    """Builds cost records and records them. Owns its background tasks, not the ledger nor the access log (told
    each recorded record: it writes the line of a request's final one)."""

    def __init__(self, ledger: Ledger, metrics: GatewayMetrics | None = None,
                 access_log: AccessLog | None = None) -> None:
        self._ledger = ledger
        self._metrics = metrics
        self._access = access_log
        self.tracing: Tracing | None = None  # told each record as the access log is (ends a request's span)
        self._tasks: set[asyncio.Task[None]] = set()

    def cost_record(self, policy: Policy, facts: RequestFacts, usage: Usage) -> CostRecord:
        """The priced record. `flagship_cost_micro_usd` is what the request would have cost on the flagship
        pool at its prices; a discarded cascade probe (status "escalated") gets 0 there: with every request
        on the flagship it would not exist, and the flagship call that replaced it carries the counterfactual.
        A shadow call (status "shadow") gets 0 too: it is the price of measuring quality, not of an answer; so does
        an answer an output check discarded (status "discarded": retried or escalated, `gateway.checking`).
        A batch line (`facts.batch_id`) costs its pool's price less the pool's batch discount, and its flagship
        counterfactual the flagship's less the flagship's (the same line sent there would be a batch line too).
        """
        decision = facts.decision
        price = policy.pools[decision.pool].price
        flagship = policy.routing.flagship_pool
        flagship_cost = policy.pools[flagship].price.cost_micro_usd(usage.prompt_tokens, usage.completion_tokens)
        cost = price.cost_micro_usd(usage.prompt_tokens, usage.completion_tokens)
        if facts.batch_id:
            cost = discounted(cost, policy.batches.discount_for(decision.pool))
            flagship_cost = discounted(flagship_cost, policy.batches.discount_for(flagship))
        return CostRecord(
            request_id=facts.request_id,
            tenant=facts.tenant,
            pool=decision.pool,
            model=decision.model,
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            usage_source=usage.source,  # where those two counts came from
            cost_micro_usd=cost,
            flagship_cost_micro_usd=0 if facts.status in ("escalated", "shadow", "discarded") else flagship_cost,
            rule=decision.rule,
            policy_version=decision.policy_version,
            started_at=facts.started_wall,
            ttft_ms=None if facts.ttft_s is None else round(facts.ttft_s * 1000, 3),
            latency_ms=round((time.monotonic() - facts.started) * 1000, 3),
            status=facts.status,
            scored_by=decision.scored_by,
            router_version=decision.router_version,
            pool_version=decision.pool_version,
            endpoint=facts.endpoint,
            route=route_text(decision.route)[:MAX_ROUTE],  # a record is never refused for its route's length
            cache=facts.cache,
            output_check=facts.output_check,
            key_id=facts.key_id,
            in_domain=decision.in_domain,
            tiers=estimates_text(decision.trade.estimates)[:MAX_ROUTE] if decision.trade is not None else "",
            completion_limit_tokens=facts.limit_set.tokens,
            completion_limit_by=facts.limit_set.by,
            batch_id=facts.batch_id,
            custom_id=facts.custom_id,
        )

    async def record(self, policy: Policy, facts: RequestFacts, usage: Usage) -> CostRecord:
        rec = self.cost_record(policy, facts, usage)
        await self.record_priced(rec)
        return rec

    async def record_priced(self, rec: CostRecord) -> None:
        """Record a record priced by its caller (a cache hit's, `gateway.caching`) and count it in the metrics."""
        with step("ledger.write"):
            await self._ledger.record(rec)
        if self._metrics is not None:
            self._metrics.observe_record(rec)
        if self._access is not None:
            self._access.answered(rec)
        if self.tracing is not None:
            self.tracing.answered(rec)

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run accounting work in the background, tracked until done."""
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("cost recording failed", exc_info=task.exception())

    async def drain(self) -> None:
        """Wait for every pending record (graceful shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
