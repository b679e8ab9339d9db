"""`LearningTap` with fakes: which requests are kept, what is written, when a shadow comparison is asked for."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson

from backends.clients.pool import Pool
from gateway.learning.loop import LearningTap
from gateway.ledger.store import MemoryLedger
from gateway.serving.records.accounting import Accountant
from gateway.serving.sending.forwarding import JSONReply
from gateway.telemetry.metrics import GatewayMetrics
from policies.decide import RouteDecision
from policies.loader import LoadedPolicy, parse_policy
from router_models.serving.scorer import conversation_shape, conversation_text
from router_models.training.labels import examples_from_rows
from router_models.training.ledger_labels import LabelKeys, label_row
from tests.conftest import policy_yaml

RAW = {"model": "auto", "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]}
ANSWER = orjson.dumps({"choices": [{"message": {"role": "assistant", "content": "hello"}}]})


class FakeStore:
    labels = LabelKeys("p:")

    def __init__(self) -> None:
        self.puts: dict[str, tuple[dict[str, str], int]] = {}

    async def put(self, key: str, fields: dict[str, str], ttl_s: int) -> None:
        self.puts[key] = (dict(fields), ttl_s)


class FakeShadow:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, str]] = []

    async def compare(self, request_id: str, raw: Any, answer: str, loaded: LoadedPolicy) -> None:
        self.calls.append((request_id, raw, answer))


def _loaded(learning: str) -> LoadedPolicy:
    return parse_policy(policy_yaml("http://127.0.0.1:1", "http://127.0.0.1:2", learning))


KEEP_AND_SHADOW = """learning:
  keep_prompts: {sample: 0.5, ttl_days: 3}
  shadow: {sample: 0.5, judge_pool: flagship}
"""


async def _observe(loaded: LoadedPolicy, decision: RouteDecision, draw: float,
                   headers: dict[str, str] | None = None) -> tuple[FakeStore, FakeShadow]:
    store, shadow = FakeStore(), FakeShadow()
    accountant = Accountant(MemoryLedger())
    metrics = GatewayMetrics(lambda: dict[str, Pool]())
    tap = LearningTap(store, accountant, metrics, shadow, rng=lambda: draw)  # type: ignore[arg-type]
    tap.observe(JSONReply(ANSWER, decision, headers or {}), RAW, "acme", "req_1", loaded)
    await accountant.drain()
    return store, shadow


def _decision(pool: str = "micro", score: float | None = 0.2) -> RouteDecision:
    return RouteDecision(pool, f"{pool}-model", score, "default", "why", "v1")


async def test_a_sampled_micro_answer_is_kept_and_compared() -> None:
    store, shadow = await _observe(_loaded(KEEP_AND_SHADOW), _decision(), draw=0.1)
    fields, ttl_s = store.puts["p:learn:prompt:req_1"]
    assert ttl_s == 3 * 86_400
    assert (fields["text"], fields["score"], fields["pool"], fields["micro"], fields["tenant"]) == (
        "hi\n\nsys", "0.2", "micro", "1", "acme")
    assert shadow.calls == [("req_1", RAW, "hello")]  # the request as the client sent it, not the scorer's text


async def test_not_sampled_unscored_or_off_keeps_nothing() -> None:
    for loaded, decision, draw in ((_loaded(KEEP_AND_SHADOW), _decision(), 0.7),
                                   (_loaded(KEEP_AND_SHADOW), _decision(score=None), 0.1),
                                   (_loaded(""), _decision(), 0.0)):
        store, shadow = await _observe(loaded, decision, draw)
        assert (store.puts, shadow.calls) == ({}, [])


async def test_a_flagship_answer_is_kept_but_never_compared() -> None:
    store, shadow = await _observe(_loaded(KEEP_AND_SHADOW), _decision("flagship", 0.9), draw=0.1)
    assert store.puts["p:learn:prompt:req_1"][0]["micro"] == "0" and shadow.calls == []


async def test_cascade_headers_become_a_weak_label() -> None:
    headers = {"x-cascade-escalated": "true", "x-cascade-confidence": "0.1234"}
    store, _ = await _observe(_loaded(KEEP_AND_SHADOW), _decision("flagship"), draw=0.1, headers=headers)
    fields, ttl_s = store.puts["p:learn:cascade:req_1"]
    assert (fields["escalated"], fields["confidence"], ttl_s) == ("1", "0.1234", 3 * 86_400)
    store, _ = await _observe(_loaded(KEEP_AND_SHADOW), _decision(), draw=0.1,
                              headers={"x-cascade-escalated": "false", "x-cascade-confidence": "none"})
    assert store.puts["p:learn:cascade:req_1"][0]["escalated"] == "0"
    assert store.puts["p:learn:cascade:req_1"][0]["confidence"] == ""


async def test_the_kept_record_carries_the_shape_a_retrain_reads_back() -> None:
    """A retrain from the ledger sees the conversation as the gateway scored it: its text and its shape."""
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "write a parser " * 200},
                {"role": "assistant", "content": "def parse(): ..." * 50}, {"role": "user", "content": "shorter"}]
    store, accountant = FakeStore(), Accountant(MemoryLedger())
    tap = LearningTap(store, accountant, GatewayMetrics(lambda: dict[str, Pool]()), None,  # type: ignore[arg-type]
                      rng=lambda: 0.1)
    tap.observe(JSONReply(ANSWER, _decision(), {}), {**RAW, "messages": messages}, "acme", "req_1",
                _loaded(KEEP_AND_SHADOW))
    await accountant.drain()
    fields, _ = store.puts["p:learn:prompt:req_1"]
    assert (fields["user_turns"], fields["assistant_turns"], fields["system_prompt"]) == ("2", "1", "1")
    row = label_row("req_1", fields, {}, {"short": "1"}, {})
    assert row is not None
    (example,) = examples_from_rows([row], default_source="ledger")
    assert (example.text, example.shape) == (conversation_text(messages).strip(), conversation_shape(messages))


async def test_traffic_unlike_the_training_data_is_kept_and_compared_more_often() -> None:
    """sample 0.2 (keep) x 0.2 (shadow): a draw of 0.5 keeps and compares nothing of figure 1 or none; at figure 0
    both rates are 0.2 x 4 = 0.8 (the default unlike_sampling), at 0.5 they are 0.2 x 2.5 = 0.5 (the draw is not
    below it)."""
    loaded = _loaded("learning:\n  keep_prompts: {sample: 0.2}\n  shadow: {sample: 0.2, judge_pool: flagship}\n")
    for figure, kept in ((None, False), (1.0, False), (0.5, False), (0.4, True), (0.0, True)):
        decision = replace(_decision(), in_domain=figure)
        store, shadow = await _observe(loaded, decision, draw=0.5)
        assert (bool(store.puts), bool(shadow.calls)) == (kept, kept), figure
    off = _loaded("learning:\n  keep_prompts: {sample: 0.2}\n  shadow: {sample: 0.2, judge_pool: flagship}\n"
                  "  in_domain: {unlike_sampling: 1}\n")
    store, _ = await _observe(off, replace(_decision(), in_domain=0.0), draw=0.5)
    assert store.puts == {}
