"""Tenants drifting from the router's training data: each decision carries its request's in-domain figure, a
tenant past the policy's share is warned about once (and again when it returns), and with `hold` its requests are
routed at the safer threshold, as a `domain-hold` step of the route, until its own label memory holds enough labels.

The scorer here is a fake with fixed scores and figures: it tests the rules, not the router."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import orjson
import pytest

from gateway.serving.openai.schema import parse_chat_request
from gateway.serving.routing.drift import DomainDrift
from gateway.serving.routing.label_memories import LabelMemories
from gateway.serving.routing.router import RequestRouter
from gateway.telemetry.metrics import GatewayMetrics
from policies.decide import RouteDecision
from policies.ladder import LadderState
from policies.learning import InDomain
from policies.loader import LoadedPolicy, parse_policy
from router_models.serving.scorer import ConversationShape, DomainSource
from tests.conftest import policy_yaml

HOLD = """learning:
  label_memory: {scope: tenant}
  in_domain: {window: 10, min_requests: 4, drift_share: 0.5, hold: {threshold: 0.2, until_labels: 3}}
"""


class FigureScorer:
    """Scores every text 0.3 (below the policy's 0.5: the micro pool); a text starting with "far" has in-domain
    figure 0.05, any other 0.9."""

    version = "fake"

    async def score(self, texts: Sequence[str]) -> list[float]:
        return [0.3] * len(texts)

    async def score_one(self, text: str, shape: ConversationShape | None = None) -> tuple[float, str]:
        return 0.3, "primary"

    def in_domain(self, text: str) -> float | None:
        return 0.05 if text.startswith("far") else 0.9

    async def aclose(self) -> None:
        return None


class Counted(LabelMemories):
    def __init__(self, labels: int) -> None:
        super().__init__(Path("/nonexistent"), lambda: None)
        self.count = labels

    def labels(self, name: str) -> int:
        return self.count


async def _route(router: RequestRouter, text: str, loaded: LoadedPolicy, tenant: str = "newco") -> RouteDecision:
    request, raw = parse_chat_request(orjson.dumps({"model": "auto", "messages": [{"role": "user", "content": text}]}))
    return await router.route(request, raw, tenant, {}, loaded, LadderState())


def test_drift_starts_past_the_share_and_ends_below_it(caplog: pytest.LogCaptureFixture) -> None:
    spec, drift = InDomain(window=10, min_requests=4, drift_share=0.5), DomainDrift()
    with caplog.at_level(logging.INFO, "cascade.router"):
        for figure in (0.1, 0.1, 0.1):
            drift.observe(spec, "newco", figure)
        assert not drift.drifting("newco")  # 3 < min_requests
        drift.observe(spec, "newco", 0.1)
        drift.observe(spec, "newco", None)  # no figure: not counted
        assert drift.drifting("newco") and drift.share_below("newco") == 1.0
        for _ in range(10):
            drift.observe(spec, "newco", 0.8)
        assert not drift.drifting("newco") and drift.share_below("newco") == 0.0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "tenant 'newco' drifts from the router's training data: 100% of its last 4" in \
        warnings[0]
    assert any("no longer drifts" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO)
    assert drift.share_below("other") is None


async def test_the_decision_carries_the_figure_and_a_drifting_tenant_is_held() -> None:
    assert isinstance(FigureScorer(), DomainSource)
    loaded = parse_policy(policy_yaml("http://127.0.0.1:9", "http://127.0.0.1:9", HOLD))
    router = RequestRouter(FigureScorer(), GatewayMetrics(dict), memories=Counted(labels=0))
    near = await _route(router, "near question", loaded)
    assert (near.in_domain, near.pool) == (0.9, "micro")
    decisions = [await _route(router, f"far question {k}", loaded) for k in range(3)]
    assert [d.pool for d in decisions[:2]] == ["micro"] * 2  # not judged before min_requests figures
    held = decisions[2]  # 3 of 4 below the bound: drifting, and its 0.3 >= the held threshold 0.2
    assert (held.pool, held.rule, held.in_domain) == ("flagship", "domain-hold", 0.05)
    assert held.route[-1].step == "domain-hold" and "until 3 own labels (0 so far)" in held.route[-1].why
    other = await _route(router, "far question", loaded, tenant="acme")  # another tenant is not drifting
    assert other.pool == "micro"
    router.memories = Counted(labels=3)  # its own labels have arrived: the usual threshold again
    assert (await _route(router, "far question 5", loaded)).pool == "micro"


async def test_without_hold_a_drifting_tenant_keeps_its_threshold() -> None:
    loaded = parse_policy(policy_yaml("http://127.0.0.1:9", "http://127.0.0.1:9",
                                      "learning:\n  in_domain: {window: 10, min_requests: 1}\n"))
    router = RequestRouter(FigureScorer(), GatewayMetrics(dict))
    decisions = [await _route(router, f"far {k}", loaded) for k in range(3)]
    assert router.drift.drifting("newco") and {d.pool for d in decisions} == {"micro"}
