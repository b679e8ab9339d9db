"""Admission: a tenant's rate limits and budget, checked before a request is routed.

Both stores are shared through Redis across gateway processes. When Redis cannot be reached a check answers
"not checked" (see `gateway.tenancy.limits` and `gateway.tenancy.budgets`) and the tenant's `on_redis_outage`
decides: `fail_open` (the default) admits the request, `fail_closed` refuses it with 503
(`AdmissionUnavailable`). While that applies: `cascade_admission_unchecked{tenant,check,policy}` counts each
such request, `cascade_admission_store_unreachable{check}` is 1, and one warning per check and policy is logged
at most every `warn_interval_s` (with the number of requests since the last one), one info line when checks
work again. Tenants without limits or budget cost no Redis round trip and are never refused for an outage.

What admission takes it gives back when the request is refused later (`Admission.refunds`): the rate limiter's
entry (`Limiter.give_back`) and the budget hold (`BudgetChecker.release`). A request refused by its budget gives
back its rate-limit entry at once. The budget hold is the request's worst case (`worst_case_micro_usd`): its
completion at the limit the gateway will send where it set none (`gateway.serving.routing.completion_limit`). A second
engine call for the same request (a cascade escalation, an output-check retry) is held before it is made
(`hold_again`): where the budget cannot carry it, it is not made.

An issued API key's own limits (`gateway.tenancy.api_keys`) apply inside the tenant's, and also under a policy that
names no tenants (every caller is `default` there, and a key's limits are all there is): its requests and tokens
per minute on the same limiter (subject `<tenant>:key:<id>`, its 429 naming the key), checked before the
tenant's; its daily budget is held like a tenant's (`KeyBudget`): the request's worst case is held against the
key's spend of the UTC day until the ledger records it, so concurrent requests of one key end at most one request's
worst case above it. A Redis outage leaves the key's checks to the tenant's `on_redis_outage` (fail_open under a
policy without tenants).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Literal

from gateway.errors import AdmissionUnavailable, GatewayError, RateLimited, TooManyRequests
from gateway.logs import LogThrottle
from gateway.serving.openai.schema import ChatRequest
from gateway.serving.routing.completion_limit import held_completion
from gateway.telemetry.metrics import GatewayMetrics
from gateway.tenancy.api_keys import ApiKey
from gateway.tenancy.budgets import BudgetChecker, BudgetVerdict, KeyBudget, key_budget_error
from gateway.tenancy.limits import Grant, Limiter
from policies.context import estimate_tokens, prompt_text_of
from policies.schema import Policy, Tenant

__all__ = ["DEFAULT_COMPLETION_ESTIMATE", "Admission", "OutageSignal", "worst_case_micro_usd"]

log = logging.getLogger("cascade.admission")
DEFAULT_COMPLETION_ESTIMATE = 256  # tokens reserved against TPM when the request sets no max_tokens
Check = Literal["rate_limit", "budget"]
_OPEN = Tenant()  # the one tenant of a policy that names none: no limits of its own, fails open


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


def _checked(policy: Policy, tenant: str, key: ApiKey | None) -> Tenant | None:
    """The tenant whose limits apply to a request (the policy's one for a policy without tenants, when the caller's
    key was issued: its own limits apply), or None when nothing is checked."""
    named = policy.tenants.get(tenant)
    if named is None and (key is None or key.source != "issued"):
        return None
    return named or _OPEN


def worst_case_micro_usd(policy: Policy, spec: Tenant, prompt_tokens: int, limit: int | None, n: int = 1) -> int:
    """What a request can cost at most, in micro-USD: its prompt and `n` choices of the completion each pool may be
    sent (`held_completion`: the client's `limit`, else the gateway's), at the prices of the dearest generative pool
    the tenant may be served by (its allowed pools, else all: routing, failover and the cascade may each move it
    up)."""
    names = [name for name in spec.allowed_pools or policy.pools
             if name in policy.pools and policy.pools[name].kind == "generative"]
    return max((policy.pools[name].price.cost_micro_usd(prompt_tokens, held_completion(policy, name, limit) * n)
                for name in names), default=0)


@dataclass(frozen=True, slots=True)
class _Taken:
    """What admission took for one request: given back if it is refused later."""

    tenant: str
    grants: tuple[tuple[str, Grant], ...]  # (limiter subject, grant): the key's, the tenant's
    held: bool
    key_held: str = ""  # the API key whose budget holds this request ("" none)
    key_limit: int = 0  # that key's daily budget, micro-USD


class Admission:
    """Checks limits, then budget. Shares, does not own, the limiter and the budget checker."""

    def __init__(self, limiter: Limiter | None, budgets: BudgetChecker | None, metrics: GatewayMetrics,
                 outage: OutageSignal | None = None, key_budget: KeyBudget | None = None) -> None:
        self._limiter = limiter
        self._budgets = budgets
        self._key_budget = key_budget
        self._metrics = metrics
        self._outage = outage or OutageSignal(metrics)
        self._taken: dict[str, _Taken] = {}  # by request id, while inside `refunds`

    async def admit(
        self, policy: Policy, tenant: str, request: ChatRequest, raw_messages: object, request_id: str = "",
        key: ApiKey | None = None,
    ) -> BudgetVerdict | None:
        """Raises `RateLimited` / `BudgetExceeded` (429 with Retry-After), or `AdmissionUnavailable` (503) when
        a check could not reach Redis and the tenant fails closed. Returns the budget verdict (None when the
        tenant has no budget): the caller downgrades to the micro pool when it says so. The budget hold is kept
        under `request_id` (the id the ledger records); call it inside `refunds(request_id)`. `key`: the caller's
        API key, whose own limits apply first."""
        spec = _checked(policy, tenant, key)
        if spec is None:
            return None
        prompt = estimate_tokens(prompt_text_of(raw_messages))
        tokens = prompt + (request.completion_limit or DEFAULT_COMPLETION_ESTIMATE) * request.n  # per choice
        worst = worst_case_micro_usd(policy, spec, prompt, request.completion_limit, request.n) if request_id else 0
        return await self._take(spec, tenant, key, tokens, worst, request_id)

    async def admit_input(self, policy: Policy, tenant: str, pool: str, tokens: int, held_tokens: int,
                          request_id: str, key: ApiKey | None = None) -> None:
        """Admit a request that is billed for its input only (an embedding pool's, `gateway.serving.embeddings`):
        `tokens` (the input's estimate) count against the tokens per minute, and its worst case, `held_tokens` at
        `pool`'s input price, is held against the budgets. Raises as `admit`; a budget that says downgrade refuses
        here as reject does (an embedding pool has no cheaper tier to move to). Call it inside `refunds`."""
        spec = _checked(policy, tenant, key)
        if spec is None:
            return
        worst = policy.pools[pool].price.cost_micro_usd(held_tokens, 0)
        verdict = await self._take(spec, tenant, key, tokens, worst, request_id)
        if verdict is not None and verdict.downgrade:
            await self._give_back(request_id, self._taken.pop(request_id, _Taken(tenant, (), False)))
            raise verdict.error(tenant)

    async def _take(self, spec: Tenant, tenant: str, key: ApiKey | None, tokens: int, worst: int,
                    request_id: str) -> BudgetVerdict | None:
        """The key's limits, the tenant's rate limits and its budget for one request of `tokens` tokens whose
        worst case is `worst` micro-USD; what it took is kept under `request_id` (see `admit`)."""
        grants: list[tuple[str, Grant]] = []
        key_held = ""
        try:
            if key is not None and key.source == "issued":
                key_held = await self._key_limits(tenant, spec, key, tokens, grants, request_id, worst)
            grant = await self._rate_limit(tenant, spec, tokens)
            grants += [(tenant, grant)] if grant is not None and grant.member is not None else []
            verdict = await self._budget(tenant, spec, request_id, worst)
        except (GatewayError, asyncio.CancelledError) as exc:  # refused, or cancelled with a hold maybe placed
            cancelled = isinstance(exc, asyncio.CancelledError) and bool(request_id)
            key_held = key.id if cancelled and key is not None and key.daily_usd is not None else key_held
            await asyncio.shield(self._give_back(request_id, _Taken(tenant, tuple(grants), cancelled, key_held)))
            raise
        held = verdict is not None and verdict.held
        if request_id and (grants or held or key_held):
            limit = (key.daily_usd or 0) if key is not None else 0
            self._taken[request_id] = _Taken(tenant, tuple(grants), held, key_held, limit)
        return verdict

    async def hold_again(self, policy: Policy, tenant: str, request_id: str, pool: str, raw_messages: object,
                         completion: int) -> bool:
        """Before a second engine call for request `request_id` (admitted, inside `refunds`): hold that call's
        worst case (its prompt and `completion` tokens, all choices, at `pool`'s prices) in place of the request's
        hold, against the key's and the tenant's budgets, counting the first call (its hold, or its cost once
        recorded). False: a budget cannot carry it, so the call must not be made (the request's hold stays; the
        caller gives it back with `give_back_hold` when no record of `request_id` will follow). True: held, or
        nothing to hold (no budget, or its store unreachable: as at admission, the spend is still recorded)."""
        taken = self._taken.get(request_id)
        if taken is None or not (taken.held or taken.key_held):
            return True
        worst = policy.pools[pool].price.cost_micro_usd(estimate_tokens(prompt_text_of(raw_messages)), completion)
        if taken.key_held and self._key_budget is not None:
            hold = await self._key_budget.reserve_key(tenant, taken.key_held, taken.key_limit, request_id, worst)
            if hold is not None and not hold.placed and worst > 0:
                self._metrics.budget.labels(tenant, "key_exceeded").inc()
                return False
        spec = policy.tenants.get(tenant)
        if taken.held and spec is not None and self._budgets is not None:
            verdict = await self._budgets.reserve(tenant, spec.budget, request_id, worst)
            if not verdict.fail_open and not verdict.held:
                self._metrics.budget.labels(tenant, verdict.state).inc()
                return False
        return True

    async def give_back_hold(self, request_id: str) -> None:
        """Release the budget holds of an admitted request whose cost no record under `request_id` will bring
        (its answer was recorded under another id); its rate-limit entries stay."""
        taken = self._taken.pop(request_id, None)
        if taken is not None:
            await asyncio.shield(self._give_back(request_id, replace(taken, grants=())))

    @asynccontextmanager
    async def refunds(self, request_id: str) -> AsyncIterator[None]:
        """Around a request's handling: a `GatewayError` (the request refused after admission) or a cancellation
        (the gateway's deadline, a client gone before its answer) gives back what `admit` took for `request_id`,
        its rate-limit entry and its budget hold; on success the ledger's record releases the hold (a record that
        still comes after a give-back adds its cost all the same). Forgets the request on the way out."""
        try:
            yield
        except (GatewayError, asyncio.CancelledError):
            taken = self._taken.pop(request_id, None)
            if taken is not None:
                await asyncio.shield(self._give_back(request_id, taken))
            raise
        finally:
            self._taken.pop(request_id, None)

    async def _give_back(self, request_id: str, taken: _Taken) -> None:
        for subject, grant in taken.grants if self._limiter is not None else ():
            await self._limiter.give_back(subject, grant)  # type: ignore[union-attr]
        if taken.held and self._budgets is not None:
            await self._budgets.release(taken.tenant, request_id)
        if taken.key_held and self._key_budget is not None:
            await self._key_budget.release_key(taken.tenant, taken.key_held, request_id)

    async def _key_limits(self, tenant: str, spec: Tenant, key: ApiKey, tokens: int,
                          grants: list[tuple[str, Grant]], request_id: str, worst: int) -> str:
        """The key's own rate limits and daily budget (see the module docstring); what it took goes in `grants`.
        Returns the key's id when its budget now holds `worst` micro-USD for `request_id`, else ""."""
        limits = key.limits
        if self._limiter is not None and (limits.requests_per_minute or limits.tokens_per_minute):
            subject = f"{tenant}:key:{key.id}"
            try:
                grant = await self._limiter.grant(subject, limits, tokens)
            except RateLimited as exc:
                self._metrics.limiter_decisions.labels(tenant, "limited").inc()
                message = exc.message.replace(f"tenant {subject!r}", f"API key {key.id!r} of tenant {tenant!r}")
                raise RateLimited(message, exc.retry_after_s, type_=exc.type) from exc
            self._outcome("rate_limit", tenant, spec, grant.checked)
            if grant.member is not None:
                grants.append((subject, grant))
        if key.daily_usd is None or self._key_budget is None:
            return ""
        hold = await self._key_budget.reserve_key(tenant, key.id, key.daily_usd, request_id, worst)
        self._outcome("budget", tenant, spec, hold is not None)
        if hold is not None and hold.exceeded(key.daily_usd):
            self._metrics.budget.labels(tenant, "key_exceeded").inc()
            raise key_budget_error(tenant, key.id, hold.spent_micro_usd, key.daily_usd, held=hold.held_micro_usd)
        return key.id if hold is not None and hold.placed else ""

    async def _rate_limit(self, tenant: str, spec: Tenant, tokens: int) -> Grant | None:
        limits = spec.rate_limits
        if self._limiter is None or not (limits.requests_per_minute or limits.tokens_per_minute):
            return None
        try:
            grant = await self._limiter.grant(tenant, limits, tokens)
        except TooManyRequests:
            self._metrics.limiter_decisions.labels(tenant, "limited").inc()
            raise
        self._metrics.limiter_decisions.labels(tenant, "admitted" if grant.checked else "unchecked").inc()
        self._outcome("rate_limit", tenant, spec, grant.checked)  # may refuse (503): nothing was taken
        return grant

    async def _budget(self, tenant: str, spec: Tenant, request_id: str, worst: int) -> BudgetVerdict | None:
        budget = spec.budget
        if self._budgets is None or (budget.daily_usd is None and budget.monthly_usd is None):
            return None
        verdict = await self._budgets.reserve(tenant, budget, request_id, worst)
        self._outcome("budget", tenant, spec, not verdict.fail_open)  # may refuse (503): nothing was held
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
