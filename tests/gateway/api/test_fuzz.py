"""Fuzzing the chat endpoint with hypothesis through the gateway in-process: no input may produce a 500, and every error
is the OpenAI envelope."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.settings import Settings
from loadtest.fake_upstream import FakeUpstream
from tests.conftest import policy_yaml
from tests.harness import FakeEngines, InProcessGateway

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant", "tool", "bogus"]) | json_values},
        optional={"content": st.text(max_size=50) | json_values, "name": json_values},
    ),
    max_size=4,
)
bodies = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from(["auto", "micro", "flagship", "nope"]) | json_values,
        "messages": messages | json_values,
        "stream": st.booleans() | json_values,
        "max_tokens": st.integers(-5, 5000) | json_values,
        "temperature": st.floats(-1, 3) | json_values,
        "n": st.integers(-1, 3),
        "stream_options": st.fixed_dictionaries({"include_usage": st.booleans() | json_values}) | json_values,
        "tools": json_values,
        "metadata": json_values,
    },
)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    """A client of the gateway under fuzz, in-process (`tests.harness`), kept for the module."""
    tmp = tmp_path_factory.mktemp("fuzz")
    engines = FakeEngines()
    micro, flagship = (engines.add(name, FakeUpstream(f"{name}-model")) for name in ("micro", "flagship"))
    path = tmp / "policy.yaml"
    path.write_text(policy_yaml(micro, flagship))
    settings_ = Settings(policy_path=path, scorer="length", start_engines=False, ledger="memory", home=tmp)
    with InProcessGateway(settings_, engines) as served:
        yield served.client


def _check(resp: httpx.Response) -> None:
    assert resp.status_code < 500, resp.text
    if resp.status_code >= 400:
        error = resp.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies)
def test_structured_bodies_never_500(gateway: httpx.Client, body: dict[str, Any]) -> None:
    _check(gateway.post("/v1/chat/completions", content=json.dumps(body)))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode()))
def test_arbitrary_bytes_never_500(gateway: httpx.Client, raw: bytes) -> None:
    _check(gateway.post("/v1/chat/completions", content=raw))
