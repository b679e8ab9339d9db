"""`Admission` on the in-memory fakes: what it takes (a rate-limit entry, a budget hold) goes back when the request
is refused by its budget, or later inside `refunds`; holds of requests in flight count against the budget."""

from __future__ import annotations

import orjson
import pytest

from gateway.errors import BudgetExceeded, NoReplicaAvailable, RateLimited
from gateway.serving.openai.schema import ChatRequest, parse_chat_request
from gateway.telemetry.metrics import GatewayMetrics
from gateway.tenancy.admission import Admission
from gateway.tenancy.budgets import StaticBudgets
from gateway.tenancy.limits import MemoryRateLimiter
from policies.schema import Policy

POLICY = Policy.model_validate({
    "version": 1,
    "pools": {name: {"type": "remote", "urls": ["http://127.0.0.1:1"], "model": name,
                     "price": {"input_per_mtok": "1.00", "output_per_mtok": price}}
              for name, price in (("micro", "1.00"), ("flagship", "100.00"))},
    "routing": {"micro_pool": "micro", "flagship_pool": "flagship", "threshold": 0.5},
    "tenants": {"acme": {"rate_limits": {"requests_per_minute": 1}, "budget": {"daily_usd": "0.0002"}}},
})
MESSAGES = [{"role": "user", "content": "hello"}]
REQUEST = ChatRequest.model_validate({"model": "auto", "messages": MESSAGES, "max_tokens": 1})


def _admission(budgets: StaticBudgets) -> Admission:
    return Admission(MemoryRateLimiter(), budgets, GatewayMetrics(dict))


async def test_a_budget_refusal_gives_the_rate_limit_entry_back() -> None:
    budgets = StaticBudgets(spent={"acme": (200, 200)})  # the whole daily budget
    admission = _admission(budgets)
    for _ in range(3):  # rpm 1: without the give-back the second would be a RateLimited
        with pytest.raises(BudgetExceeded):
            await admission.admit(POLICY, "acme", REQUEST, MESSAGES, "req-1")


async def test_holds_count_and_go_back_when_the_request_is_refused_later() -> None:
    budgets = StaticBudgets()
    admission = _admission(budgets)
    async def refused_after_admission(request_id: str) -> None:
        async with admission.refunds(request_id):
            verdict = await admission.admit(POLICY, "acme", REQUEST, MESSAGES, request_id)
            assert verdict is not None and verdict.held
            assert budgets.held["acme"] == {request_id: 102}  # 2 + 1 tokens at the flagship's prices, rounded
            raise NoReplicaAvailable("no replica")
    for i in range(3):  # each gives its request and its hold back: rpm 1 and the budget never bind
        with pytest.raises(NoReplicaAvailable):
            await refused_after_admission(f"req-{i}")
        assert budgets.held["acme"] == {}
    verdict = await admission.admit(POLICY, "acme", REQUEST, MESSAGES, "kept")  # served: the ledger releases it
    assert verdict is not None and verdict.held
    with pytest.raises(RateLimited):
        await admission.admit(POLICY, "acme", REQUEST, MESSAGES, "next")
    budgets.spent["acme"] = (98, 98)  # 98 spent + 102 held = the budget: nothing more fits, whatever the limiter
    limitless = Admission(None, budgets, GatewayMetrics(dict))
    with pytest.raises(BudgetExceeded):
        await limitless.admit(POLICY, "acme", REQUEST, MESSAGES, "more")


async def test_the_max_tokens_cap_is_what_the_budget_holds() -> None:
    """CASCADE_MAX_TOKENS_CAP clamps the body the engine gets and the limit admission holds: a request asking for
    more than the cap, or for nothing, is held at the cap (1 token here: 2 + 1 tokens at the flagship's prices)."""
    for limit in ({"max_tokens": 5000}, {"max_completion_tokens": 5000}, {}):
        body = orjson.dumps({"model": "auto", "messages": MESSAGES, **limit})
        request, raw = parse_chat_request(body, max_tokens_cap=1)
        assert request.completion_limit == 1 and raw.get("max_completion_tokens", raw.get("max_tokens")) == 1
        budgets = StaticBudgets()
        await Admission(None, budgets, GatewayMetrics(dict)).admit(POLICY, "acme", request, MESSAGES, "req")
        assert budgets.held["acme"] == {"req": 102}
