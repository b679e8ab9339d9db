"""Admission: a tenant's rate limits and budget, checked before a request is routed.

Both stores are shared through Redis across gateway processes and fail open on an outage (see
`gateway.tenancy.limits` and `gateway.tenancy.budgets`). Tenants without limits or budget cost no Redis round trip.
"""

from __future__ import annotations

import logging

from gateway.control.metrics import GatewayMetrics
from gateway.serving.schema import ChatRequest
from gateway.tenancy.budgets import BudgetChecker, BudgetVerdict
from gateway.tenancy.limits import Limiter
from policies.context import estimate_tokens, prompt_text_of
from policies.schema import Policy

__all__ = ["DEFAULT_COMPLETION_ESTIMATE", "Admission"]

log = logging.getLogger("cascade.admission")
DEFAULT_COMPLETION_ESTIMATE = 256  # tokens reserved against TPM when the request sets no max_tokens


class Admission:
    """Checks limits, then budget. Shares, does not own, the limiter and the budget checker."""

    def __init__(self, limiter: Limiter | None, budgets: BudgetChecker | None, metrics: GatewayMetrics) -> None:
        self._limiter = limiter
        self._budgets = budgets
        self._metrics = metrics

    async def admit(
        self, policy: Policy, tenant: str, request: ChatRequest, raw_messages: object
    ) -> BudgetVerdict | None:
        """Raises `RateLimited` / `BudgetExceeded` (429 with Retry-After). Returns the budget verdict
        (None when the tenant has no budget): the caller downgrades to the micro pool when it says so."""
        spec = policy.tenants.get(tenant)
        if spec is None:
            return None
        limits = spec.rate_limits
        if self._limiter is not None and (limits.requests_per_minute or limits.tokens_per_minute):
            tokens = estimate_tokens(prompt_text_of(raw_messages))
            tokens += (request.completion_limit or DEFAULT_COMPLETION_ESTIMATE) * request.n  # per choice
            await self._limiter.admit(tenant, limits, tokens)
        budget = spec.budget
        if self._budgets is None or (budget.daily_usd is None and budget.monthly_usd is None):
            return None
        verdict = await self._budgets.check(tenant, budget)
        if verdict.state != "ok":
            self._metrics.budget.labels(tenant, verdict.state).inc()
        if verdict.reject:
            raise verdict.error(tenant)
        return verdict
