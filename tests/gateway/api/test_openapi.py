"""The OpenAPI document at /openapi.json, and schemathesis driving the real gateway (uvicorn, in front of
fake engines) from it: no input may produce a 5xx, and every error is an OpenAI error body."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from schemathesis import Case, CheckContext, Response
from schemathesis.checks import not_a_server_error, response_schema_conformance
from starlette.types import Receive, Scope, Send

from gateway.api.app import create_app
from gateway.api.openapi import build_openapi
from gateway.serving.openai.schema import ChatRequest
from gateway.settings import Settings
from loadtest.fake_upstream import FakeUpstream, read_body
from tests.conftest import policy_yaml
from tests.servers import serve


class TolerantUpstream:
    """A fake engine that ignores `metadata`: there the fake reads its test knobs (token counts, delays),
    which fuzzed values would turn into the fake's own failures rather than the gateway's."""

    def __init__(self, model: str) -> None:
        self.inner = FakeUpstream(model)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/chat/completions":
            return await self.inner(scope, receive, send)
        body = await read_body(receive)
        raw = orjson.loads(body)
        raw.pop("metadata", None)
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": orjson.dumps(raw), "more_body": False}

        await self.inner(scope, replay, send)


@pytest.fixture(scope="module")
def gateway_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("openapi")
    with serve(TolerantUpstream("micro-model")) as micro, serve(TolerantUpstream("flagship-model")) as flagship:
        path = tmp / "policy.yaml"
        path.write_text(policy_yaml(micro, flagship))
        settings_ = Settings(policy_path=path, scorer="none", start_engines=False, ledger="memory", home=tmp,
                             policy_watch_interval_s=0, max_body_bytes=64 * 1024)
        with serve(create_app(settings_)) as url:
            yield url


# The document the app serves (checked equal below); loaded from the builder because schemathesis'
# lazy fixture loader does not work with pytest 9.
schema = schemathesis.openapi.from_dict(build_openapi())


@schemathesis.check
def openai_error_body(ctx: CheckContext, response: Response, case: Case[Any]) -> bool | None:
    """Every 4xx/5xx carries `{"error": {"message": str, "type": str, "param", "code"}}` as JSON."""
    if response.status_code < 400:
        return None
    assert response.headers.get("content-type", [""])[0].startswith("application/json"), response.headers
    body = orjson.loads(response.content)
    error = body["error"]
    assert isinstance(error["message"], str) and error["message"], body
    assert isinstance(error["type"], str) and error["type"], body
    assert set(error) <= {"message", "type", "param", "code"}, body
    assert "Traceback" not in error["message"], body
    return None


@schema.parametrize()
@schema.given(model=st.sampled_from([None, "auto", "micro", "flagship", "micro-model"]))
@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
def test_fuzz_public_api_from_its_schema(case: Case[Any], model: str | None, gateway_url: str) -> None:
    """`model` swaps a generated model name (nearly always unknown: a 404) for one the policy serves, so
    that most fuzzed bodies reach the router, the limits and the (fake) engines."""
    if model is not None and isinstance(case.body, dict) and isinstance(case.body.get("model"), str):
        case.body["model"] = model
    case.call_and_validate(base_url=gateway_url, timeout=10,
                           checks=[not_a_server_error, openai_error_body, response_schema_conformance])


def test_schema_is_served_and_matches_the_request_model(gateway_url: str) -> None:
    served = httpx.get(gateway_url + "/openapi.json").json()
    assert served == orjson.loads(orjson.dumps(build_openapi()))
    assert {"/v1/chat/completions", "/v1/models", "/healthz", "/readyz"} <= set(served["paths"])
    request = served["components"]["schemas"]["ChatCompletionRequest"]
    model = ChatRequest.model_json_schema()
    assert request["properties"].keys() == model["properties"].keys()
    assert request["required"] == model["required"]
    assert request["properties"]["n"] == model["properties"]["n"]
    messages = served["components"]["schemas"]["ChatMessage"]
    assert messages["properties"]["role"]["enum"] == ["system", "developer", "user", "assistant", "tool", "function"]


def test_schema_accepts_what_the_gateway_accepts(gateway_url: str) -> None:
    """A request valid by the schema gets a completion that matches the documented response."""
    loaded = schemathesis.openapi.from_url(gateway_url + "/openapi.json")
    operation = loaded["/v1/chat/completions"]["POST"]
    body: dict[str, Any] = {"model": "micro", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    case = operation.Case(body=body, media_type="application/json")
    response = case.call_and_validate(checks=[not_a_server_error, response_schema_conformance])
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 3
