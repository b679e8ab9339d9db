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
from gateway.learning.judge import JUDGE_SYSTEM_PROMPT, parse_verdict
from gateway.settings import Settings
from loadtest.fake_upstream import FakeUpstream, read_body
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
        def run(learning: str, verdict: str = "SHORT", flagship_delay_ms: float = 0.0) -> Started:
            micro, flagship, judge = FakeUpstream("micro-model"), FakeUpstream("flagship-model"), JudgeUpstream(verdict)
            flagship.delay_ms = flagship_delay_ms
            urls = [stack.enter_context(serve(app)) for app in (micro, flagship, judge)]
            path = tmp_path / "policy.yaml"
            path.write_text(_policy(urls[0], urls[1], urls[2], learning))
            settings = Settings(policy_path=path, scorer="length", start_engines=False, ledger="redis",
                                redis_prefix=prefix, home=tmp_path, policy_watch_interval_s=0)
            return stack.enter_context(serve(create_app(settings))), flagship, judge

        yield run


SHADOW = """learning:
  keep_prompts: {{sample: 1}}
  shadow: {{sample: 1, judge_pool: judge, daily_budget_usd: "{budget}", max_tokens: 8}}
"""


def _records(prefix: str) -> dict[str, dict[str, str]]:
    client = redis.Redis.from_url(SHARED_URL, decode_responses=True)
    try:
        entries: list[tuple[str, dict[str, str]]] = client.xrange(prefix + "records")  # type: ignore[assignment]
        return {fields["request_id"]: fields for _, fields in entries}
    finally:
        client.close()


def _wait_for(check: Callable[[], Any], timeout_s: float = 10.0) -> Any:
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
    assert (label["short"], label["verdict"]) == ("1", "SHORT")
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
    assert "w0 w1 w2 w3" in body["messages"][1]["content"] and "w7" in body["messages"][1]["content"]
    (row,) = read_ledger_labels(SHARED_URL, key_prefix=prefix)
    assert (row["id"], row["source"], row["needs_flagship"], row["pool"]) == (request_id, "shadow", 1.0, "micro")
    result = await verify_recent(prefix)
    assert result.ok and result.records == 3, result
    assert 'cascade_learning_events_total{event="shadow_judged"} 1.0' in httpx.get(url + "/metrics").text


def test_a_streamed_answer_is_compared_once_complete(start: Any, prefix: str) -> None:
    url, _, judge = start(SHADOW.format(budget="1.00"), verdict="OK.")
    with httpx.stream("POST", url + "/v1/chat/completions", timeout=30,
                      json={"model": "auto", "messages": MESSAGES, "max_tokens": 3, "stream": True}) as r:
        request_id = r.headers["x-request-id"]
        assert "[DONE]" in r.read().decode()
    label = _wait_for(lambda: _shadow_label(prefix, request_id))
    assert label["short"] == "0"
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


def test_verdict_parsing_takes_the_first_word() -> None:
    assert parse_verdict("SHORT") is True and parse_verdict(" short, because...") is True
    assert parse_verdict("OK.") is False and parse_verdict("ok") is False
    assert parse_verdict("") is None and parse_verdict("Answer A is worse") is None
