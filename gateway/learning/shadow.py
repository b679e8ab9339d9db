"""Shadow comparison: ask the flagship too, then a judge, and keep the verdict as a label.

Runs only in the background, after the client's answer is complete (never on the response path, never
changing it). For one kept request that the micro pool answered: the flagship pool (policy
`learning.shadow.flagship_pool`, default `routing.flagship_pool`) answers the same messages with at most
`max_tokens`, then the judge pool compares the two answers with the fixed prompt of `gateway.learning.judge`:
the conversation as the client sent it, the two answers in an order drawn per request id, and with
`both_orders` a second time swapped. The combined outcome (micro, flagship, tie or inconsistent) goes to
`LabelKeys.shadow`; only micro, tie (the micro answer is as good) and flagship carry a training label. All calls
are priced at their pools' prices and recorded in the ledger as their own records (`<id>-shadow`,
`<id>-judge`, `<id>-judge-swapped`, status "shadow", tenant `SHADOW_TENANT`, no flagship counterfactual), so
their spend shows in cost reports without being charged to the client's tenant.

Budget: before each call, today's (UTC) spend of `SHADOW_TENANT` (the ledger's own per-day spend counter)
must be below `daily_budget_usd`; a budget of 0 makes no calls. The check comes before each call, so the
calls in flight (at most `max_in_flight` per process) can take the day past the budget by their own cost.
When the budget (or the judge) stops the swapped judgement, the first one alone is the verdict.

Events (`cascade_learning_events`): `shadow_judged` per stored verdict, and `judge_<outcome>` with its outcome
(`judge_inconsistent`: the two orders disagreed, the judge's position bias or indecision); skips and failures
as `shadow_busy`, `shadow_budget`, `shadow_failed`, `shadow_unparsed`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import orjson
import redis.asyncio as aioredis

from backends.clients.pool import Pool
from backends.clients.shared import EngineClient
from gateway.errors import GatewayError
from gateway.learning.judge import (
    JUDGE_MAX_TOKENS,
    Outcome,
    Preference,
    combine,
    conversation_for_judge,
    judge_messages,
    micro_first,
    parse_verdict,
    preference,
)
from gateway.learning.store import LearningStore
from gateway.ledger.keys import LedgerKeys, utc_periods
from gateway.serving.openai.usage import count_usage, usage_from_json
from gateway.serving.records.accounting import Accountant, RequestFacts
from gateway.serving.sending.forwarding import Forwarder
from gateway.telemetry.metrics import GatewayMetrics
from policies.decide import RouteDecision, served_model
from policies.loader import LoadedPolicy

__all__ = ["SHADOW_TENANT", "ShadowComparison", "answer_text"]

log = logging.getLogger("cascade.shadow")
SHADOW_TENANT = "cascade.shadow"
# the training label of each outcome: "1" when the micro answer fell short, "" (no label) when inconsistent
_SHORT: dict[Outcome, str] = {"flagship": "1", "micro": "0", "tie": "0", "inconsistent": ""}
_DROPPED = ("stream", "stream_options", "logprobs", "top_logprobs", "max_completion_tokens", "n")


class ShadowComparison:
    """Runs shadow comparisons. Shares (does not own) the forwarder, pools, engines, accountant and Redis."""

    def __init__(self, forwarder: Forwarder, pools: Mapping[str, Pool], engines: EngineClient,
                 accountant: Accountant, store: LearningStore, redis: aioredis.Redis, prefix: str,
                 metrics: GatewayMetrics, order: Callable[[str], bool] = micro_first) -> None:
        """`order(request_id)` says whether the micro answer is shown first (tests may fix it)."""
        self._fw = forwarder
        self._pools = pools
        self._engines = engines
        self._accountant = accountant
        self._store = store
        self._redis = redis
        self._ledger = LedgerKeys(prefix)
        self._metrics = metrics
        self._order = order
        self._in_flight = 0

    async def compare(self, request_id: str, raw: Mapping[str, Any], micro_answer: str,
                      loaded: LoadedPolicy) -> None:
        """Compare one micro answer to the request `raw` (the client's body); stores the verdict, or counts why
        it did not (busy, budget, failed, unparsed) in `cascade_learning_events`. Never raises for an engine
        failure."""
        cfg = loaded.policy.learning.shadow
        if self._in_flight >= cfg.max_in_flight:
            return self._event("shadow_busy")
        self._in_flight += 1
        try:
            await self._compare(request_id, raw, micro_answer, loaded)
        finally:
            self._in_flight -= 1

    async def _compare(self, request_id: str, raw: Mapping[str, Any], micro_answer: str,
                       loaded: LoadedPolicy) -> None:
        policy = loaded.policy
        cfg = policy.learning.shadow
        body = {k: v for k, v in raw.items() if k not in _DROPPED} | {"max_tokens": cfg.max_tokens}
        flagship = cfg.flagship_pool or policy.routing.flagship_pool
        reference = await self._budgeted_call(loaded, flagship, f"{request_id}-shadow", body)
        if reference is None or cfg.judge_pool is None:
            return
        conversation = conversation_for_judge(raw["messages"])
        micro_is_a = self._order(request_id)
        first = await self._judge(loaded, f"{request_id}-judge", conversation, micro_answer, reference, micro_is_a)
        if first is None:
            return
        second = None
        if cfg.both_orders:
            second = await self._judge(loaded, f"{request_id}-judge-swapped", conversation, micro_answer,
                                       reference, not micro_is_a)
        outcome = combine(first[0], None if second is None else second[0])
        replies = first[1] if second is None else f"{first[1]}/{second[1]}"
        fields = {"short": _SHORT[outcome], "verdict": outcome, "replies": replies,
                  "order": "micro-first" if micro_is_a else "flagship-first", "at": repr(time.time())}
        ttl_s = policy.learning.keep_prompts.ttl_days * 86_400
        await self._store.put(self._store.labels.shadow(request_id), fields, ttl_s)
        self._event("shadow_judged")
        self._event(f"judge_{outcome}")

    async def _judge(self, loaded: LoadedPolicy, record_id: str, conversation: str, micro_answer: str,
                     reference: str, micro_is_a: bool) -> tuple[Preference, str] | None:
        """The judge's preference in one order and its reply word; None when over budget, failed or unparsed."""
        pool = loaded.policy.learning.shadow.judge_pool
        assert pool is not None
        answers = (micro_answer, reference) if micro_is_a else (reference, micro_answer)
        body = {"messages": judge_messages(conversation, *answers), "max_tokens": JUDGE_MAX_TOKENS,
                "temperature": 0}
        reply = await self._budgeted_call(loaded, pool, record_id, body)
        if reply is None:
            return None
        verdict = parse_verdict(reply)
        if verdict is None:
            log.warning("shadow judge gave no verdict", extra={"request_id": record_id, "reply": reply[:80]})
            self._event("shadow_unparsed")
            return None
        return preference(verdict, micro_is_a), verdict

    async def _budgeted_call(self, loaded: LoadedPolicy, pool_name: str, record_id: str,
                             body: dict[str, Any]) -> str | None:
        """The answer text of one priced, recorded call; None when over budget or the call failed."""
        if await self.spent_today() >= loaded.policy.learning.shadow.daily_budget_usd:
            self._event("shadow_budget")
            return None
        pool = self._pools.get(pool_name)
        if pool is None:
            self._event("shadow_failed")
            return None
        try:
            return await self._call(loaded, pool, record_id, body)
        except (GatewayError, ValueError) as exc:  # an engine down or refusing, or an unreadable answer
            log.warning("shadow call failed", extra={"request_id": record_id, "error": str(exc)})
            self._event("shadow_failed")
            return None

    async def _call(self, loaded: LoadedPolicy, pool: Pool, record_id: str, body: dict[str, Any]) -> str:
        model = served_model(loaded.policy, pool.name)
        upstream = {**body, "model": model}
        started, started_wall = time.monotonic(), time.time()
        replica, answer = await self._fw.complete(pool, orjson.dumps(upstream))
        parsed = orjson.loads(answer)
        text = answer_text(parsed)
        usage = usage_from_json(parsed) or await count_usage(loaded.policy.pools.get(pool.name), self._engines,
                                                             replica.url, model, upstream["messages"], text)
        decision = RouteDecision(pool.name, model, None, "shadow", f"shadow comparison ({record_id})",
                                 loaded.version)
        facts = RequestFacts(record_id, SHADOW_TENANT, decision, started_wall, started, None, "shadow")
        await self._accountant.record(loaded.policy, facts, usage)
        return text

    async def spent_today(self) -> int:
        """Micro-USD recorded today (UTC) for shadow and judge calls, from the ledger's spend hash."""
        month, day = utc_periods(time.time())
        raw = await self._redis.hget(self._ledger.spend(SHADOW_TENANT, month), day)
        return int(raw or 0)

    def _event(self, name: str) -> None:
        self._metrics.learning.labels(name).inc()


def answer_text(answer: Any) -> str:
    """The first choice's message content of a chat.completion object ("" when it has none)."""
    choices = answer.get("choices") if isinstance(answer, dict) else None
    message = (choices[0] or {}).get("message") if isinstance(choices, list) and choices else None
    content = message.get("content") if isinstance(message, dict) else None
    return content if isinstance(content, str) else ""
