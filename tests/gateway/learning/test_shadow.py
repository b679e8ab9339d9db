"""Shadow comparisons and cascade labels against a real gateway (uvicorn), the real Redis and fake engines:
off the client's response path, priced in the ledger as their own records, capped by the daily budget."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import redis
from starlette.types import Receive, Scope, Send

from gateway.api.app import create_app
from gateway.learning.judge import JUDGE_SYSTEM_PROMPT, micro_first
from gateway.settings import Settings
from loadtest.fake_upstream import FakeUpstream, read_body
from loadtest.scenarios.chaos_figures import ledger_records
from router_models.training.ledger_labels import LabelKeys, read_ledger_labels
from tests.conftest import SHARED_URL, policy_yaml, verify_recent
from tests.servers import serve

pytestmark = pytest.mark.redis
MESSAGES = [{"role": "user", "content": "say something short"}]


class JudgeUpstream:
    """A judge engine: answers every chat request with `verdict` (1 completion token, 100 prompt tokens) and
    keeps the bodies it got; everything else is the fake engine's."""

    def __init__(self, verdict: str) -> None:
        self.inner = FakeUpstream("judge-model")
        self.verdict = verdict
        self.bodies: list[dict[str, Any]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/chat/completions":
            return await self.inner(scope, receive, send)
        body = await read_body(receive)
        self.bodies.append(orjson.loads(body))
        choice = {"index": 0, "message": {"role": "assistant", "content": self.verdict}, "finish_reason": "stop"}
        out = {"id": "j", "object": "chat.completion", "created": 0, "model": "judge-model", "choices": [choice],
               "usage": {"prompt_tokens": 100, "completion_tokens": 1, "total_tokens": 101}}
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": orjson.dumps(out)})


def _policy(micro: str, flagship: str, judge: str, learning: str) -> str:
    judge_pool = f"""  judge:
    type: remote
    urls: ["{judge}"]
    model: judge-model
    price: {{input_per_mtok: "1.00", output_per_mtok: "1.00"}}
routing:"""
    return policy_yaml(micro, flagship, learning).replace("routing:", judge_pool, 1)


Started = tuple[str, FakeUpstream, JudgeUpstream]


@pytest.fixture
def start(tmp_path: Path, prefix: str) -> Iterator[Callable[..., Started]]:
    """start(learning_yaml, verdict=..., flagship_delay_ms=...) -> (gateway url, flagship engine, judge engine)."""
    with ExitStack() as stack:
        def run(learning: str, verdict: str = "A", flagship_delay_ms: float = 0.0) -> Started:
            micro, flagship, judge = FakeUpstream("micro-model"), FakeUpstream("flagship-model"), JudgeUpstream(verdict)
            flagship.delay_ms = flagship_delay_ms
            flagship.content = "the flagship's answer"
            urls = [stack.enter_context(serve(app)) for app in (micro, flagship, judge)]
            path = tmp_path / "policy.yaml"
            path.write_text(_policy(urls[0], urls[1], urls[2], learning))
            settings = Settings(policy_path=path, scorer="length", start_engines=False, ledger="redis",
                                redis_prefix=prefix, home=tmp_path, policy_watch_interval_s=0)
            return stack.enter_context(serve(create_app(settings))), flagship, judge

        yield run


# max_in_flight 8: the tests send up to 4 requests back to back, and with the default 2 a comparison still
# running on a loaded machine turns the next into "shadow_busy" (no label to wait for)
SHADOW = """learning:
  keep_prompts: {{sample: 1}}
  shadow: {{sample: 1, judge_pool: judge, daily_budget_usd: "{budget}", max_tokens: 8, max_in_flight: 8}}
"""


def _records(prefix: str) -> dict[str, dict[str, str]]:
    return {fields["request_id"]: fields for fields in ledger_records(SHARED_URL, prefix)}


def _wait_for(check: Callable[[], Any], timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := check()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return value


def _shadow_label(prefix: str, request_id: str) -> dict[str, str]:
    client = redis.Redis.from_url(SHARED_URL, decode_responses=True)
    try:
        return {str(k): str(v) for k, v in client.hgetall(LabelKeys(prefix).shadow(request_id)).items()}
    finally:
        client.close()


def _chat(url: str, **extra: Any) -> httpx.Response:
    r = httpx.post(url + "/v1/chat/completions", json={"model": "auto", "messages": MESSAGES, "max_tokens": 4,
                                                       **extra}, timeout=30)
    assert r.status_code == 200, r.text
    return r


async def test_shadow_runs_after_the_answer_and_is_priced_as_its_own_records(start: Any, prefix: str) -> None:
    url, flagship, judge = start(SHADOW.format(budget="1.00"), flagship_delay_ms=100)  # flagship: 0.8 s
    assert flagship.requests == 0
    began = time.monotonic()
    r = _chat(url)
    assert time.monotonic() - began < 0.6 and r.headers["x-cascade-pool"] == "micro"
    request_id = r.headers["x-request-id"]
    assert _shadow_label(prefix, request_id) == {}  # the client had its answer before the shadow was done
    label = _wait_for(lambda: _shadow_label(prefix, request_id))
    micro_is_a = micro_first(request_id)  # the judge says "A": the pool whose answer was shown first wins
    assert (label["short"], label["verdict"], label["replies"]) == (("0", "micro", "A") if micro_is_a
                                                                    else ("1", "flagship", "A"))
    assert label["order"] == ("micro-first" if micro_is_a else "flagship-first")
    records = _wait_for(lambda: (recs := _records(prefix)) and len(recs) == 3 and recs)
    shadow, verdict = records[f"{request_id}-shadow"], records[f"{request_id}-judge"]
    assert (shadow["status"], shadow["tenant"], shadow["pool"], shadow["rule"]) == ("shadow", "cascade.shadow",
                                                                                    "flagship", "shadow")
    prompt, completion = int(shadow["prompt_tokens"]), int(shadow["completion_tokens"])
    assert completion == 8  # the policy's max_tokens, not the client's 4
    assert int(shadow["cost_micro_usd"]) == (prompt * 3_000_000 + completion * 15_000_000 + 500_000) // 1_000_000
    assert int(shadow["flagship_cost_micro_usd"]) == 0
    assert (verdict["pool"], verdict["prompt_tokens"], verdict["cost_micro_usd"]) == ("judge", "100", "101")
    assert flagship.requests == 1
    assert records[request_id]["tenant"] == "default"  # the client's own record is untouched
    (body,) = judge.bodies
    assert body["messages"][0]["content"] == JUDGE_SYSTEM_PROMPT
    shown = body["messages"][1]["content"]
    first, second = ("w0 w1 w2 w3", "the flagship's answer")[:: 1 if micro_is_a else -1]
    assert f"Answer A:\n{first}\n\nAnswer B:\n{second}" in shown
    (row,) = read_ledger_labels(SHARED_URL, key_prefix=prefix)
    assert (row["id"], row["source"], row["pool"]) == (request_id, "shadow", "micro")
    assert row["needs_flagship"] == (0.0 if micro_is_a else 1.0)
    result = await verify_recent(prefix)
    assert result.ok and result.records == 3, result
    assert 'cascade_learning_events_total{event="shadow_judged"} 1.0' in httpx.get(url + "/metrics").text


def test_a_streamed_answer_is_compared_once_complete(start: Any, prefix: str) -> None:
    url, _, judge = start(SHADOW.format(budget="1.00"), verdict="Tie.")
    with httpx.stream("POST", url + "/v1/chat/completions", timeout=30,
                      json={"model": "auto", "messages": MESSAGES, "max_tokens": 3, "stream": True}) as r:
        request_id = r.headers["x-request-id"]
        assert "[DONE]" in r.read().decode()
    label = _wait_for(lambda: _shadow_label(prefix, request_id))
    assert (label["short"], label["verdict"]) == ("0", "tie")  # as good as the flagship's
    assert "w0 w1 w2" in judge.bodies[0]["messages"][1]["content"]


def test_a_zero_budget_makes_no_shadow_calls(start: Any, prefix: str) -> None:
    url, flagship, judge = start(SHADOW.format(budget="0"))
    ids = [_chat(url).headers["x-request-id"] for _ in range(3)]
    _wait_for(lambda: 'event="shadow_budget"} 3.0' in httpx.get(url + "/metrics").text, 5)
    assert 'cascade_learning_events_total{event="shadow_budget"} 3.0' in httpx.get(url + "/metrics").text
    assert (flagship.requests, judge.bodies) == (0, [])
    assert sorted(_records(prefix)) == sorted(ids)  # only the clients' own records
    assert all(_shadow_label(prefix, i) == {} for i in ids)


def test_the_budget_is_checked_before_each_call(start: Any, prefix: str) -> None:
    url, flagship, judge = start(SHADOW.format(budget="0.000001"))  # 1 micro-USD: one call gets through
    first = _chat(url).headers["x-request-id"]
    assert _wait_for(lambda: f"{first}-shadow" in _records(prefix))
    _wait_for(lambda: 'event="shadow_budget"} 1.0' in httpx.get(url + "/metrics").text, 5)
    second = _chat(url).headers["x-request-id"]
    _wait_for(lambda: 'event="shadow_budget"} 2.0' in httpx.get(url + "/metrics").text, 5)
    assert (flagship.requests, judge.bodies) == (1, [])  # the judge call of the first and the second: skipped
    assert sorted(_records(prefix)) == sorted([first, f"{first}-shadow", second])
    assert read_ledger_labels(SHARED_URL, key_prefix=prefix) == []


def test_cascade_escalations_are_weak_labels(start: Any, prefix: str) -> None:
    learning = "  cascade: {enabled: true, min_confidence: 0.5}\nlearning:\n  keep_prompts: {sample: 1}\n"
    url, _, _ = start(learning)
    unsure = _chat(url, metadata={"fake_logprob": "-5"})
    sure = _chat(url, metadata={"fake_logprob": "-0.01"})
    assert (unsure.headers["x-cascade-escalated"], sure.headers["x-cascade-escalated"]) == ("true", "false")
    rows = _wait_for(lambda: len(rows := read_ledger_labels(SHARED_URL, key_prefix=prefix)) == 2 and rows)
    by_id = {row["id"]: row for row in rows}
    escalated, kept = by_id[unsure.headers["x-request-id"]], by_id[sure.headers["x-request-id"]]
    assert (escalated["source"], escalated["needs_flagship"], escalated["pool"]) == ("escalation", 1.0, "flagship")
    assert (kept["source"], kept["needs_flagship"], kept["pool"]) == ("escalation", 0.0, "micro")
    client = redis.Redis.from_url(SHARED_URL, decode_responses=True)
    stored = client.hgetall(LabelKeys(prefix).cascade(unsure.headers["x-request-id"]))
    client.close()
    assert float(stored["confidence"]) == pytest.approx(0.0067, abs=1e-4)


BOTH_ORDERS = """learning:
  keep_prompts: {sample: 1}
  shadow: {sample: 1, judge_pool: judge, daily_budget_usd: "1.00", max_tokens: 8, both_orders: true,
           max_in_flight: 8}
"""


def test_a_judge_that_follows_the_position_gives_no_pool_a_win(start: Any, prefix: str) -> None:
    url, _, judge = start(BOTH_ORDERS, verdict="A")  # always prefers whatever it is shown first
    ids = [_chat(url).headers["x-request-id"] for _ in range(4)]
    labels = _wait_for(lambda: all(ls := [_shadow_label(prefix, i) for i in ids]) and ls)
    assert [label["verdict"] for label in labels] == ["inconsistent"] * 4
    assert all(label["short"] == "" and label["replies"] == "A/A" for label in labels)
    assert len(judge.bodies) == 8  # each pair judged twice, once in each order
    for request_id, label in zip(ids, labels, strict=True):
        assert label["order"] == ("micro-first" if micro_first(request_id) else "flagship-first")
    shown = [body["messages"][1]["content"] for body in judge.bodies]
    assert sum("Answer A:\nw0" in text for text in shown) == 4  # the micro answer first in half of them
    assert read_ledger_labels(SHARED_URL, key_prefix=prefix) == []  # no label says either pool is better
    records = _wait_for(lambda: (recs := _records(prefix)) and len(recs) == 16 and recs)
    assert all(f"{i}-judge-swapped" in records for i in ids)
    metrics = httpx.get(url + "/metrics").text
    assert 'cascade_learning_events_total{event="judge_inconsistent"} 4.0' in metrics


def test_the_judge_reads_the_conversation_the_client_sent(start: Any, prefix: str) -> None:
    url, _, judge = start(SHADOW.format(budget="1.00"))
    context = " ".join(f"fact{i:03d}{'x' * 32}" for i in range(160))  # 6,399 characters, past the scorer's 2,000
    # (160 long words: the length scorer's cut of it scores low, so the micro pool answers)
    messages = [{"role": "system", "content": "You answer in French."},
                {"role": "user", "content": [{"type": "text", "text": context}]},
                {"role": "assistant", "content": "Noted."},
                {"role": "user", "content": "now name the last fact"}]
    request_id = _chat(url, messages=messages).headers["x-request-id"]
    assert _wait_for(lambda: _shadow_label(prefix, request_id))
    shown = judge.bodies[0]["messages"][1]["content"]
    assert f"[system]\nYou answer in French.\n\n[user]\n{context}\n\n[assistant]\nNoted.\n\n" \
           "[user]\nnow name the last fact" in shown
    client = redis.Redis.from_url(SHARED_URL, decode_responses=True)
    kept = str(client.hget(LabelKeys(prefix).prompt(request_id), "text"))
    client.close()
    assert "fact159" not in kept and "fact159" in shown  # the scorer's cut would have lost the tail
