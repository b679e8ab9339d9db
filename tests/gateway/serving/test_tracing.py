"""OpenTelemetry traces through a real gateway to a real OTLP/HTTP receiver: the client's trace continued, one
request span with the GenAI attributes (the provider included) and no prompt text, a child span per engine attempt
whose traceparent the engine receives; off without an endpoint; a malformed traceparent starts a new trace."""

from __future__ import annotations

import time
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from starlette.types import Receive, Scope, Send

from gateway.api.app import create_app
from gateway.serving.records.tracing import tracing_from_env
from gateway.settings import Settings
from tests.conftest import Upstreams, policy_yaml
from tests.servers import serve

SECRET = "the zebra-plum merger terms"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


class Receiver:
    """An OTLP/HTTP trace receiver: POST /v1/traces (protobuf), spans kept as dicts (only those of `trace_ids` when
    given: a receiver of a whole session's engines keeps what its tests look for)."""

    def __init__(self, trace_ids: Collection[str] | None = None) -> None:
        self.spans: list[dict[str, Any]] = []
        self.trace_ids = trace_ids
        self.url = ""  # its base URL, where a fixture that serves it says

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        request = ExportTraceServiceRequest.FromString(body)
        for resource in request.resource_spans:
            for scoped in resource.scope_spans:
                for span in scoped.spans:
                    if self.trace_ids is not None and span.trace_id.hex() not in self.trace_ids:
                        continue
                    attrs = {a.key: getattr(a.value, a.value.WhichOneof("value")) for a in span.attributes}
                    self.spans.append({"name": span.name, "trace_id": span.trace_id.hex(), "kind": span.kind,
                                       "span_id": span.span_id.hex(), "parent": span.parent_span_id.hex(),
                                       "attrs": attrs, "events": [e.name for e in span.events],
                                       "raw": bytes(body)})
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/x-protobuf")]})
        await send({"type": "http.response.body", "body": b""})


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    rec = Receiver()
    with serve(rec) as url:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", url + "/v1/traces")
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")  # export within 50 ms, not the default 5 s
        yield rec


def _wait(receiver: Receiver, n: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 15
    while len(receiver.spans) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    return receiver.spans


def test_a_request_continues_the_clients_trace_to_the_engine(tmp_path: Path, upstreams: Upstreams,
                                                             receiver: Receiver) -> None:
    _, micro_url, flagship, flagship_url = upstreams
    policy = tmp_path / "policy.yaml"
    text = policy_yaml(micro_url, flagship_url)  # the flagship's servers say who serves them (a vLLM of our own)
    policy.write_text(text.replace("model: flagship-model\n", "model: flagship-model\n    provider: vllm\n"))
    app = create_app(Settings(policy_path=policy, scorer="none", start_engines=False, ledger="memory",
                              home=tmp_path, access_log=None))
    body = {"model": "flagship", "messages": [{"role": "user", "content": SECRET}], "max_tokens": 8}
    parent = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
    with serve(app) as url:
        answer = httpx.post(url + "/v1/chat/completions", json=body, headers={"traceparent": parent}, timeout=30)
        sent_to_engine = flagship.last_traceparent
        streamed = httpx.post(url + "/v1/chat/completions", json={**body, "stream": True},
                              headers={"traceparent": "00-not-a-trace-01"}, timeout=30)
        spans = _wait(receiver, 10)  # per request: itself, admission, route, the engine attempt, the ledger write
    assert answer.status_code == streamed.status_code == 200
    ours = [s for s in spans if s["trace_id"] == TRACE_ID]
    request = next(s for s in ours if s["name"] == "chat flagship")
    engine = next(s for s in ours if s["name"] == "engine flagship")
    assert request["parent"] == "00f067aa0ba902b7" and engine["parent"] == request["span_id"]
    a = request["attrs"]
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == "flagship"
    assert a["gen_ai.response.model"] == "flagship-model" and a["cascade.pool"] == "flagship"
    assert a["gen_ai.usage.input_tokens"] > 0 and a["gen_ai.usage.output_tokens"] > 0
    assert a["cascade.cost_micro_usd"] > 0 and a["cascade.route"].startswith("pinned:flagship")
    assert engine["attrs"]["http.response.status_code"] == 200
    assert a["gen_ai.provider.name"] == engine["attrs"]["gen_ai.provider.name"] == "vllm"
    steps = {s["name"] for s in ours if s["parent"] == request["span_id"]}
    assert steps == {"admission", "route", "engine flagship", "ledger.write"}, steps
    # the engine call carried the engine span's context; the malformed traceparent started a trace of its own
    assert sent_to_engine == f"00-{TRACE_ID}-{engine['span_id']}-01"
    assert flagship.last_traceparent is not None and flagship.last_traceparent.split("-")[1] != TRACE_ID
    streamed_request = next(s for s in spans if s["name"] == "chat flagship" and s["trace_id"] != TRACE_ID)
    assert streamed_request["parent"] == "" and streamed_request["events"] == ["gen_ai.first_token"]
    assert all(SECRET.encode() not in s["raw"] and b"zebra" not in s["raw"] for s in spans)


def test_tracing_is_off_without_an_endpoint_and_a_dead_receiver_holds_no_request(
        tmp_path: Path, upstreams: Upstreams, monkeypatch: pytest.MonkeyPatch) -> None:
    assert not tracing_from_env({}).enabled
    assert not tracing_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_SDK_DISABLED": "true"}).enabled
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:9/v1/traces")  # nothing listens
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    # the exporter retries a refused export until its timeout (10 s by default) when the app stops and flushes
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "1")
    _, micro_url, _, flagship_url = upstreams
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml(micro_url, flagship_url))
    app = create_app(Settings(policy_path=policy, scorer="none", start_engines=False, ledger="memory",
                              home=tmp_path, access_log=None))
    body = {"model": "micro", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    with serve(app) as url:
        started = time.monotonic()
        codes = [httpx.post(url + "/v1/chat/completions", json=body, timeout=30).status_code for _ in range(5)]
        assert codes == [200] * 5 and time.monotonic() - started < 10
