"""Admission: a tenant's rate limits and budget, checked before a request is routed.

Both stores are shared through Redis across gateway processes. When Redis cannot be reached a check answers
"not checked" (see `gateway.tenancy.limits` and `gateway.tenancy.budgets`) and the tenant's `on_redis_outage`
decides: `fail_open` (the default) admits the request, `fail_closed` refuses it with 503
(`AdmissionUnavailable`). While that applies: `cascade_admission_unchecked{tenant,check,policy}` counts each
such request, `cascade_admission_store_unreachable{check}` is 1, and one warning per check and policy is logged
at most every `warn_interval_s` (with the number of requests since the last one), one info line when checks
work again. Tenants without limits or budget cost no Redis round trip and are never refused for an outage.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Literal

from gateway.control.metrics import GatewayMetrics
from gateway.errors import AdmissionUnavailable, TooManyRequests
from gateway.logs import LogThrottle
from gateway.serving.schema import ChatRequest
from gateway.tenancy.budgets import BudgetChecker, BudgetVerdict
from gateway.tenancy.limits import Limiter
from policies.context import estimate_tokens, prompt_text_of
from policies.schema import Policy, Tenant

__all__ = ["DEFAULT_COMPLETION_ESTIMATE", "Admission", "OutageSignal"]

log = logging.getLogger("cascade.admission")
DEFAULT_COMPLETION_ESTIMATE = 256  # tokens reserved against TPM when the request sets no max_tokens
Check = Literal["rate_limit", "budget"]


class OutageSignal:
    """Metrics and rate-limited log lines for checks that could not reach their store. Used from one loop;
    `monotonic` (seconds) is injectable for tests."""

    def __init__(self, metrics: GatewayMetrics, warn_interval_s: float = 30.0,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._metrics = metrics
        self._lines = LogThrottle(warn_interval_s, monotonic)
        self._down: set[Check] = set()

    def unchecked(self, check: Check, tenant: str, policy: str) -> None:
        self._metrics.unchecked.labels(tenant, check, policy).inc()
        self._metrics.store_unreachable.labels(check).set(1)
        self._down.add(check)
        since = self._lines.due((check, policy))
        if since is None:
            return
        action = "admitted unchecked" if policy == "fail_open" else "refused with 503"
        log.warning("%s not checked (Redis unreachable): %s, %d request(s) since the last line (tenant %r was the "
                    "latest)", check.replace("_", " "), f"{policy}: {action}", since, tenant)

    def checked(self, check: Check) -> None:
        if check in self._down:
            self._down.discard(check)
            self._metrics.store_unreachable.labels(check).set(0)
            self._lines.forget(lambda key: isinstance(key, tuple) and key[0] == check)
            log.info("%s checked again: Redis reachable", check.replace("_", " "))


class Admission:
    """Checks limits, then budget. Shares, does not own, the limiter and the budget checker."""

    def __init__(self, limiter: Limiter | None, budgets: BudgetChecker | None, metrics: GatewayMetrics,
                 outage: OutageSignal | None = None) -> None:
        self._limiter = limiter
        self._budgets = budgets
        self._metrics = metrics
        self._outage = outage or OutageSignal(metrics)

    async def admit(
        self, policy: Policy, tenant: str, request: ChatRequest, raw_messages: object
    ) -> BudgetVerdict | None:
        """Raises `RateLimited` / `BudgetExceeded` (429 with Retry-After), or `AdmissionUnavailable` (503) when
        a check could not reach Redis and the tenant fails closed. Returns the budget verdict (None when the
        tenant has no budget): the caller downgrades to the micro pool when it says so."""
        spec = policy.tenants.get(tenant)
        if spec is None:
            return None
        limits = spec.rate_limits
        if self._limiter is not None and (limits.requests_per_minute or limits.tokens_per_minute):
            tokens = estimate_tokens(prompt_text_of(raw_messages))
            tokens += (request.completion_limit or DEFAULT_COMPLETION_ESTIMATE) * request.n  # per choice
            try:
                checked = await self._limiter.admit(tenant, limits, tokens)
            except TooManyRequests:
                self._metrics.limiter_decisions.labels(tenant, "limited").inc()
                raise
            self._metrics.limiter_decisions.labels(tenant, "admitted" if checked else "unchecked").inc()
            self._outcome("rate_limit", tenant, spec, checked)
        budget = spec.budget
        if self._budgets is None or (budget.daily_usd is None and budget.monthly_usd is None):
            return None
        verdict = await self._budgets.check(tenant, budget)
        self._outcome("budget", tenant, spec, not verdict.fail_open)
        if verdict.state != "ok":
            self._metrics.budget.labels(tenant, verdict.state).inc()
        if verdict.reject:
            raise verdict.error(tenant)
        return verdict

    def _outcome(self, check: Check, tenant: str, spec: Tenant, checked: bool) -> None:
        if checked:
            self._outage.checked(check)
            return
        self._outage.unchecked(check, tenant, spec.on_redis_outage)
        if spec.on_redis_outage == "fail_closed":
            what = "rate limits" if check == "rate_limit" else "budget"
            raise AdmissionUnavailable(f"The {what} of tenant {tenant!r} cannot be checked right now (the gateway's "
                                       "store is unreachable) and its policy fails closed; retry shortly.")
