"""End to end with real parts: vLLM engines (demo models) and the gateway as separate processes, the
official openai SDK as the client, the real Redis ledger and the trained classifier.

Slow (engine start-up is minutes on 2 CPU cores): one gateway, started once for the module.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from gateway.api.auth import hash_key
from gateway.costs.report import row_fields
from loadtest.load.metrics import samples
from tests.conftest import delete_prefix, ledger_record, report_recent
from tests.engines import FLAGSHIP_CONTEXT, Gateway, SharedEngines, demo_policy_text, gateway_on_shared_engines

pytestmark = [pytest.mark.engines, pytest.mark.redis]



@pytest.fixture(scope="module")
def prefix() -> str:
    return f"test:e2e:{uuid.uuid4().hex[:8]}:"


@pytest.fixture(scope="module")
def served(prefix: str, shared_engines: SharedEngines, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """The demo policy's engines (shared; the flagship with twice micro's context), and a gateway in front of
    them with the trained classifier, the true cascade, output checks and input guards."""
    policy = tmp_path_factory.mktemp("e2e") / "policy.yaml"
    shipped = demo_policy_text()
    line = "  threshold: {flagship_share: 0.3, initial: 0.28}"
    assert shipped.count(line) == 1, "the shipped routing threshold changed: update this test"
    # The demo policy with the true cascade on: micro answers first, unsure answers escalate to the flagship.
    # ...and output checks: a JSON answer that does not hold its schema escalates (requests tagged
    # metadata.check=json go to micro by a rule: no score, so no cascade escalation comes first)
    policy.write_text(shipped.replace(
        line, line + "\n  cascade: {enabled: true, min_confidence: 0.5, first_tokens: 8}"
        "\n  rules:\n    - {name: json-on-micro, match: {metadata: {check: [json]}}, pool: micro}")
        + "\noutput_checks: {json: escalate}\n" + GUARD_TENANTS)
    try:
        with gateway_on_shared_engines(shared_engines, policy, prefix) as gateway:
            yield gateway
    finally:
        delete_prefix(prefix)


@pytest.fixture(scope="module")
def gateway(served: Gateway) -> str:
    return served.url


@pytest.fixture(scope="module")
def micro_engine(served: Gateway) -> str:
    return served.engines["micro"]


# Input guards need tenants: the other tests' key ("unused") stays the open gateway's tenant name, `default`
GUARD_TENANTS = f"""
tenants:
  default: {{api_key_sha256: ['{hash_key("unused")}']}}
  redacting: {{api_key_sha256: ['{hash_key("sk-e2e-redact")}'], guards: {{pii: {{action: redact}}}}}}
  refusing: {{api_key_sha256: ['{hash_key("sk-e2e-refuse")}'], guards: {{pii: {{action: refuse}}}}}}
"""


# default.yaml routes a flagship share, starting from this threshold until it has seen 200 scores
POLICY_INITIAL_THRESHOLD = 0.28



def test_hard_prompt_is_routed_to_the_flagship_and_priced(gateway: str, prefix: str) -> None:
    client = openai.OpenAI(base_url=gateway + "/v1", api_key="unused")
    prompt = ("Prove that the square root of 2 is irrational, then generalise the argument to every integer "
              "that is not a perfect square, step by step.")
    raw = client.chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": prompt}], max_tokens=12,
    )
    resp = raw.parse()
    assert (raw.headers["x-cascade-pool"], raw.headers["x-cascade-rule"]) == ("flagship", "threshold")
    assert float(raw.headers["x-cascade-score"]) >= POLICY_INITIAL_THRESHOLD
    assert resp.model == "flagship"  # the demo engines serve their pool's name
    assert resp.usage is not None and resp.usage.completion_tokens > 0
    rec = ledger_record(prefix, raw.headers["x-request-id"])
    assert rec["pool"] == "flagship"
    assert int(rec["prompt_tokens"]) == resp.usage.prompt_tokens
    assert int(rec["completion_tokens"]) == resp.usage.completion_tokens
    assert int(rec["cost_micro_usd"]) > 0


@pytest.mark.parametrize("stream", [False, True])
def test_easy_prompt_goes_to_micro_and_the_unsure_answer_escalates(gateway: str, prefix: str, stream: bool) -> None:
    """The demo models are random: their answers are near-uniform guesses (confidence ~1/vocab), so the
    cascade must escalate every one, before any byte reaches the client, and charge both calls."""
    client = openai.OpenAI(base_url=gateway + "/v1", api_key="unused")
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hi! How are you?"}]
    if stream:
        with client.chat.completions.with_streaming_response.create(
            model="auto", messages=messages, max_tokens=12, stream=True, stream_options={"include_usage": True},
        ) as raw:
            chunks = list(raw.parse())
        headers, models = raw.headers, {c.model for c in chunks}
    else:
        resp = client.chat.completions.with_raw_response.create(model="auto", messages=messages, max_tokens=12)
        headers, models = resp.headers, {resp.parse().model}
    assert float(headers["x-cascade-score"]) < POLICY_INITIAL_THRESHOLD
    assert (headers["x-cascade-escalated"], headers["x-cascade-rule"]) == ("true", "cascade")
    assert float(headers["x-cascade-confidence"]) < 0.5
    assert models == {"flagship"}  # nothing of the micro answer reached the client
    probe = ledger_record(prefix, headers["x-request-id"] + "-probe")
    final = ledger_record(prefix, headers["x-request-id"])
    assert (probe["pool"], probe["status"]) == ("micro", "escalated")
    assert int(probe["completion_tokens"]) > 0 and int(probe["cost_micro_usd"]) >= 0
    assert (final["pool"], final["rule"], final["status"]) == ("flagship", "cascade", "ok")
    print(f"cascade confidence of the demo micro model: {headers['x-cascade-confidence']}")


@pytest.mark.parametrize("pool", ["micro", "flagship"])
def test_streaming_pinned_pool_counts_usage_exactly(gateway: str, prefix: str, pool: str) -> None:
    client = openai.OpenAI(base_url=gateway + "/v1", api_key="unused")
    with client.chat.completions.with_streaming_response.create(
        model=pool, messages=[{"role": "user", "content": "Write a long story about a lighthouse."}],
        max_tokens=24, stream=True, stream_options={"include_usage": True},
    ) as raw:
        assert raw.headers["x-cascade-pool"] == pool
        assert raw.headers["x-cascade-rule"] == "pinned"
        chunks = list(raw.parse())
    usage = chunks[-1].usage
    assert usage is not None and 0 < usage.completion_tokens <= 24
    text_chunks = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert text_chunks, "the engine streamed no text"
    rec = ledger_record(prefix, raw.headers["x-request-id"])
    assert (int(rec["prompt_tokens"]), int(rec["completion_tokens"])) == (usage.prompt_tokens, usage.completion_tokens)
    assert rec["usage_source"] == "engine" and rec["status"] == "ok"


def _replica(gateway: str, pool: str) -> str:
    """The base URL of `pool`'s first replica, as the gateway's /metrics names it."""
    return next(labels["replica"] for name, labels, _ in samples(httpx.get(gateway + "/metrics").text)
                if name == "cascade_replica_in_flight" and labels.get("pool") == pool)


LEAVING_ATTEMPTS = 3
NOTICE_S = 1.0
"""How long after a client leaves the gateway may still relay. It looks every 8 chunks (`SSEResponse`, whose own tests
hold it to that), but a gateway the host keeps off the CPU looks late: 0.96 s in a fresh clone at load 21.5 (fc4 of
2026-12-07, four pytest-xdist workers beside the int8 demo; 0.25 s until then). A gateway that never looked relays
until the engine ends, about 2 s of 900 tokens after a leave at the fifth chunk, later on a loaded host."""


def _leave_after_five_chunks(gateway: str) -> tuple[str, list[str], float]:
    """Read a long stream as raw SSE and leave after its fifth content chunk: the request id, the content read and
    when the client had left (epoch seconds)."""
    body = {"model": "micro", "messages": [{"role": "user", "content": "Write a very long story about a lighthouse."}],
            "max_tokens": 900, "stream": True, "ignore_eos": True, "logprobs": True, "top_logprobs": 20}
    read: list[str] = []
    # The gateway must still be relaying when the client leaves: a client with a small receive buffer, as a slow
    # reader has, and an answer larger than the buffers between them (20 logprobs a token: over a kilobyte an
    # event, a megabyte in all; without them the 130 KB answer could fit in the gateway's transport buffer, its
    # socket's and the client's, and a late reader found it all relayed)
    small = httpx.HTTPTransport(socket_options=[(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)])
    with httpx.Client(timeout=60, headers={"authorization": "Bearer unused"}, transport=small) as client, \
            client.stream("POST", gateway + "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200, resp.read()
        request_id = resp.headers["x-request-id"]
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                read += [c["delta"]["content"] for c in json.loads(line[6:])["choices"] if c["delta"].get("content")]
            if len(read) >= 5:
                break  # leaving the block closes the connection mid-stream
    return request_id, read, time.time()


def test_client_leaving_mid_stream_is_charged_for_what_was_generated(gateway: str, prefix: str) -> None:
    """The client reads a long stream as raw SSE and leaves after its fifth content chunk: the engine request
    is aborted, and the record counts the prompt and the completion with the engine's own tokenizer, at least
    every token of the text the client read (counted by the engine's /tokenize). Not exact: the client's reads
    lag what the gateway relayed (about 150 tokens here, in its buffers when it left), and the count is the
    relayed text re-tokenized, which for the demo model's broken UTF-8 exceeds the tokens generated (194 for
    150; vLLM's own counter said 120 while the record said 153), capped by the request's `max_tokens` (900).

    The premise is that the client leaves while the answer is still being made, and the demo engine makes all 900
    tokens in about 2 s: a test process held off the CPU that long after the headers (a loaded 2-core machine)
    leaves after the whole answer was generated and relayed into the socket buffers, which is a complete answer
    (`ok`, 900 tokens; once in about ten suite runs). Likewise a client that leaves as the last chunks go out: the
    gateway looks for a departed client every 8 chunks, so a leave within its last `NOTICE_S` finds the whole
    answer made and relayed (`ok`, 900 tokens, the record ending after the client left: a fresh clone). So
    an attempt whose record is `ok` with the whole answer, ending before the client left or within `NOTICE_S`
    after, is not a mid-stream leave and is tried again (at most three; if all three are, the premise did not hold
    and the test is skipped, saying so: the gateway billed each correctly); an `ok` that ends later than that (the
    leave went unnoticed while the engine made the rest) fails, as does every other outcome."""
    late: list[tuple[str, float]] = []
    for _ in range(LEAVING_ATTEMPTS):
        request_id, read, left_at = _leave_after_five_chunks(gateway)
        rec = ledger_record(prefix, request_id)
        relayed_after = float(rec["started_at"]) + float(rec["latency_ms"]) / 1000 - left_at  # s after the leave
        if rec["status"] != "ok" or int(rec["completion_tokens"]) < 900 or relayed_after > NOTICE_S:
            break
        late.append((rec["completion_tokens"], round(relayed_after, 2)))  # the whole answer, relayed as it left
    else:  # the gateway billed each whole answer right; what failed is the premise, a leave while it is being made
        pytest.skip(f"no attempt left mid-stream: each whole answer was relayed as the client left (tokens, s "
                    f"relayed after it left): {late}; in a fresh clone the engine's tokens came in a burst at the end")
    assert rec["status"] == "client_disconnect" and rec["usage_source"] == "tokenizer", (
        f"{rec['status']}, {rec['completion_tokens']} tokens, relayed until {relayed_after:+.2f} s after the "
        f"client left; retried: {late}; record: {rec}")
    assert int(rec["prompt_tokens"]) > 0 and int(rec["cost_micro_usd"]) > 0
    tokenize = {"model": "micro", "prompt": "".join(read), "add_special_tokens": False}
    counted = httpx.post(_replica(gateway, "micro") + "/tokenize", json=tokenize).json()["count"]
    billed = int(rec["completion_tokens"])
    # never past the request's 900 (re-tokenized relayed text can count more than the engine made: 970 seen)
    assert 0 < min(counted, 900) <= billed <= 900, (counted, billed, rec)


def test_errors_from_real_engine_path(gateway: str) -> None:
    client = openai.OpenAI(base_url=gateway + "/v1", api_key="unused")
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="micro", messages=[{"role": "user", "content": "x"}], max_tokens=5000)
    assert "max_tokens" in str(err.value)
    assert {m.id for m in client.models.list()} >= {"auto", "micro", "flagship"}
    ready = httpx.get(gateway + "/readyz").json()
    assert ready["ready"] and ready["redis"] and ready["pools"] == {"micro": True, "flagship": True}


ANSWER_SCHEMA = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {
    "type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}}}


@pytest.mark.parametrize("stream", [False, True])
def test_a_json_answer_that_does_not_hold_its_schema_is_escalated_or_flagged(gateway: str, prefix: str,
                                                                             stream: bool) -> None:
    """Three tokens cannot hold `{"answer": ""}` (guided decoding or not): the micro answer fails the json check.
    A JSON client's answer is escalated before its first byte; a stream has left and is flagged."""
    client = openai.OpenAI(base_url=gateway + "/v1", api_key="unused")
    ask: dict[str, Any] = {"model": "auto", "messages": [{"role": "user", "content": "What is 2+2? Answer in JSON."}],
                           "max_tokens": 3, "response_format": ANSWER_SCHEMA, "metadata": {"check": "json"}}
    if stream:
        with client.chat.completions.with_streaming_response.create(**ask, stream=True) as raw:
            list(raw.parse())
        headers = raw.headers
        assert (headers["x-cascade-pool"], headers["x-cascade-rule"]) == ("micro", "json-on-micro")
        rec = ledger_record(prefix, headers["x-request-id"])
        assert (rec["pool"], rec["status"], rec["output_check"]) == ("micro", "ok", "fail:json")
        return
    resp = client.chat.completions.with_raw_response.create(**ask)
    headers = resp.headers
    assert (headers["x-cascade-pool"], headers["x-cascade-rule"]) == ("flagship", "output-check")
    assert headers["x-cascade-output-check-action"] == "escalated:json"
    assert headers["x-cascade-output-check"] == "json=fail"  # the flagship's 3 tokens fail too: served, flagged
    assert resp.parse().model == "flagship"
    dropped = ledger_record(prefix, headers["x-request-id"] + "-check")
    served = ledger_record(prefix, headers["x-request-id"])
    assert (dropped["pool"], dropped["status"], dropped["output_check"]) == ("micro", "discarded", "fail:json")
    assert int(dropped["completion_tokens"]) > 0 and dropped["flagship_cost_micro_usd"] == "0"
    assert (served["pool"], served["status"], served["output_check"]) == ("flagship", "ok", "fail:json")
    metrics = httpx.get(gateway + "/metrics").text
    assert 'cascade_output_checks_total{check="json",model="micro",pool="micro",result="fail"}' in metrics
    assert 'cascade_output_check_actions_total{action="escalated",check="json",pool="micro"} 1.0' in metrics
    report = asyncio.run(report_recent(prefix))
    (micro,) = [row for row in report.rows("pool") if row.key == "micro"]
    assert micro.counters.output_check_failed >= 1
    assert row_fields(micro, report.pools)["output_check_failure_rate"].endswith("%")


CARD = "4111 1111 1111 1111"


@pytest.mark.parametrize("stream", [False, True])
def test_a_card_number_is_redacted_before_the_engine_or_refused(gateway: str, stream: bool) -> None:
    """What the engine saw, in its own words: vLLM's `echo` prepends the last message's content (an assistant turn
    the answer continues) as the engine received it. The redacting tenant's card number reaches the engine as
    a placeholder; the refusing tenant's request is answered 400 before any engine call, naming no digits."""
    messages: list[Any] = [{"role": "user", "content": "Please read back my card number."},
                           {"role": "assistant", "content": f"Your card is {CARD}, noted"}]
    client = openai.OpenAI(base_url=gateway + "/v1", api_key="sk-e2e-redact")
    ask: dict[str, Any] = {"model": "micro", "messages": messages, "max_tokens": 2, "extra_body": {"echo": True}}
    if stream:
        with client.chat.completions.with_streaming_response.create(**ask, stream=True) as raw:
            text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
        headers = raw.headers
    else:
        resp = client.chat.completions.with_raw_response.create(**ask)
        text, headers = resp.parse().choices[0].message.content or "", resp.headers
    assert headers["x-cascade-guard"] == "pii=redacted:card"
    assert text.startswith("Your card is [REDACTED:card], noted"), text
    assert "4111" not in text
    refusing = openai.OpenAI(base_url=gateway + "/v1", api_key="sk-e2e-refuse")
    with pytest.raises(openai.BadRequestError) as err:
        refusing.chat.completions.create(model="micro", messages=messages, max_tokens=2, stream=stream)
    assert err.value.code == "pii_detected" and "card" in err.value.message and "4111" not in err.value.message
    assert err.value.response.headers["x-cascade-guard"] == "pii=refused:card"
    metrics = httpx.get(gateway + "/metrics").text
    assert 'cascade_guard_decisions_total{action="redacted",guard="pii",kind="card",tenant="redacting"}' in metrics
    assert 'cascade_guard_decisions_total{action="refused",guard="pii",kind="card",tenant="refusing"}' in metrics


def _conversation(engine: str, tokens: int) -> list[ChatCompletionMessageParam]:
    """A multi-turn conversation of about `tokens` prompt tokens as the micro engine counts them."""
    turn = "Here is the next part of the incident log we are reviewing together, line by line. " * 4
    messages: list[ChatCompletionMessageParam] = []
    while True:
        messages += [{"role": "user", "content": turn}, {"role": "assistant", "content": "Noted, go on."}]
        asked: list[ChatCompletionMessageParam] = [*messages,
                                                   {"role": "user", "content": "Summarise the log in one line."}]
        count = httpx.post(engine + "/tokenize", json={"model": "micro", "messages": asked},
                           timeout=30).json()["count"]
        if count >= tokens:
            return asked


def test_a_conversation_too_long_for_micro_is_served_by_the_flagship_whose_context_holds_it(
        gateway: str, prefix: str, micro_engine: str) -> None:
    """Routed to micro by a rule, a 1,300-token conversation does not fit micro's 1,024: the flagship (2,048)
    answers it, streamed and not, and the engine's 400 is never seen."""
    client = openai.OpenAI(base_url=gateway + "/v1", api_key="unused")
    messages = _conversation(micro_engine, 1300)
    direct = httpx.post(micro_engine + "/v1/chat/completions", timeout=60,
                        json={"model": "micro", "messages": messages, "max_tokens": 16})
    assert direct.status_code == 400  # what the client got before: micro's engine refuses it
    for stream in (False, True):
        raw = client.chat.completions.with_raw_response.create(
            model="auto", messages=messages, max_tokens=16, metadata={"check": "json"}, stream=stream)
        parsed = raw.parse()
        if isinstance(parsed, openai.Stream):
            assert stream and any(c.choices and c.choices[0].delta.content for c in parsed)
        else:
            assert not stream and parsed.choices[0].message.content
        assert (raw.headers["x-cascade-pool"], raw.headers["x-cascade-rule"]) == ("flagship", "context-fit")
        rec = ledger_record(prefix, raw.headers["x-request-id"])
        assert (rec["pool"], rec["rule"], rec["status"]) == ("flagship", "context-fit", "ok")
        assert 1024 < int(rec["prompt_tokens"]) <= FLAGSHIP_CONTEXT - 16


def test_a_conversation_no_pool_holds_is_a_400_naming_the_sizes(gateway: str, micro_engine: str) -> None:
    client = openai.OpenAI(base_url=gateway + "/v1", api_key="unused")
    with pytest.raises(openai.BadRequestError) as pinned:  # a pinned model is never moved
        client.chat.completions.create(model="micro", messages=_conversation(micro_engine, 1300), max_tokens=16)
    assert pinned.value.code == "context_length_exceeded"
    assert "'micro' holds 1024 tokens" in pinned.value.message and "pinned" in pinned.value.message
    with pytest.raises(openai.BadRequestError) as routed:
        client.chat.completions.create(model="auto", messages=_conversation(micro_engine, 2100), max_tokens=16)
    assert routed.value.code == "context_length_exceeded"
    assert "'micro' holds 1024 tokens" in routed.value.message
    assert f"'flagship' holds {FLAGSHIP_CONTEXT} tokens" in routed.value.message
