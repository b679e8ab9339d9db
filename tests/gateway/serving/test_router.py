"""`RequestRouter` with the shipped router artifact: it scores the conversation (its text and its shape: turns,
whole length), not only the text the embedder reads."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest_asyncio

from gateway.serving.openai.schema import parse_chat_request
from gateway.serving.routing.router import RequestRouter
from gateway.telemetry.metrics import GatewayMetrics
from policies.ladder import LadderState
from policies.loader import parse_policy
from router_models.serving.artifact import DEFAULT_ARTIFACT
from router_models.serving.classifier_scorer import ClassifierScorer, load_scorer
from router_models.serving.scorer import conversation_shape, conversation_text
from tests.conftest import policy_yaml

LOADED = parse_policy(policy_yaml("http://127.0.0.1:9", "http://127.0.0.1:9"))  # threshold 0.5: every request scored
LATEST = {"role": "user", "content": "Can you make it shorter and keep the numbers?"}
# Written here: these show which input reaches the scorer, never which conversation is harder.
HISTORY = [{"role": "assistant", "content": "Here is the quarterly report you asked for. " * 80},
           {"role": "tool", "content": '{"rows": 1200, "revenue": [1.2, 3.4, 5.6]}'},
           {"role": "assistant", "content": "I added the revenue table and the notes. " * 40}]


@pytest_asyncio.fixture
async def scorer() -> AsyncIterator[ClassifierScorer]:
    scorer = load_scorer(str(DEFAULT_ARTIFACT), torch_threads=1)
    yield scorer
    await scorer.aclose()


async def _score(router: RequestRouter, messages: list[dict[str, Any]]) -> float | None:
    request, raw = parse_chat_request(orjson.dumps({"model": "auto", "messages": messages}))
    decision = await router.route(request, raw, "anyone", {}, LOADED, LadderState())
    return decision.score


async def test_the_same_latest_turn_after_a_long_history_scores_differently(scorer: ClassifierScorer) -> None:
    """The history here is assistant and tool turns, which the scoring text leaves out: the text is the same, so
    only the conversation's shape (its turns and whole length) can move the score."""
    router = RequestRouter(scorer, GatewayMetrics(dict))
    alone, long_chat = [LATEST], [*HISTORY, LATEST]
    assert conversation_text(alone) == conversation_text(long_chat)
    score_alone, score_long = await _score(router, alone), await _score(router, long_chat)
    assert score_alone is not None and score_long is not None
    assert abs(score_long - score_alone) > 1e-3
    direct = await scorer.score_one(conversation_text(long_chat), conversation_shape(long_chat))
    assert score_long == direct[0]  # the router hands the scorer the conversation's shape
    assert score_alone == (await scorer.score([conversation_text(alone)]))[0]  # one user turn: a plain prompt


class Refining:
    """A `Scorer` that is `Refinable`: records the thresholds it is told before each score, scores 0.6."""

    version = "refining"

    def __init__(self) -> None:
        self.told: list[tuple[float, ...]] = []

    def refine_near(self, *thresholds: float) -> None:
        self.told.append(thresholds)

    async def score(self, texts: list[str]) -> list[float]:
        return [0.6] * len(texts)

    async def score_one(self, text: str, shape: object = None) -> tuple[float, str]:
        assert self.told, "the scorer was not told the threshold before it scored"
        return 0.6, "primary"

    async def aclose(self) -> None:
        return None


async def test_a_two_stage_scorer_is_told_the_threshold_in_use_before_it_scores() -> None:
    refining = Refining()
    router = RequestRouter(refining, GatewayMetrics(dict))  # type: ignore[arg-type]
    assert await _score(router, [LATEST]) == 0.6
    assert refining.told == [(0.5,)]  # the policy's threshold (no live threshold here)
    fixed = parse_policy(policy_yaml("http://127.0.0.1:9", "http://127.0.0.1:9").replace("threshold: 0.5",
                                                                                         "threshold: 0.3"))
    request, raw = parse_chat_request(orjson.dumps({"model": "auto", "messages": [LATEST]}))
    await router.route(request, raw, "anyone", {}, fixed, LadderState())
    assert refining.told[-1] == (0.3,)


async def test_a_two_stage_scorer_is_told_every_tenant_rule_and_ladder_threshold() -> None:
    """One band for every request the scorer batches: the tenants' and rules' own thresholds and the ladder's raised
    one are refined around too, not only the routing threshold (a request of a tenant with its own threshold was
    routed on the fast score alone)."""
    refining = Refining()
    router = RequestRouter(refining, GatewayMetrics(dict))  # type: ignore[arg-type]
    extra = """  rules:
    - {name: contracts, match: {keywords: [contract]}, threshold: 0.26}
tenants:
  acme: {threshold: 0.35}
  globex: {}
"""
    loaded = parse_policy(policy_yaml("http://127.0.0.1:9", "http://127.0.0.1:9", extra))
    request, raw = parse_chat_request(orjson.dumps({"model": "auto", "messages": [LATEST]}))
    await router.route(request, raw, "globex", {}, loaded, LadderState())
    assert refining.told[-1] == (0.26, 0.35, 0.5)
    await router.route(request, raw, "globex", {}, loaded, LadderState(threshold=0.7, threshold_step="surge"))
    assert refining.told[-1] == tuple([0.26, 0.35, 0.5, 0.7])
