"""Request limits at the HTTP edge: message count, max_tokens clamp, the request deadline."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.conftest import GatewayFactory
from tests.harness import Gateway


@pytest.fixture
def gateway(make_gateway: GatewayFactory, fake_policy_file: Path) -> Gateway:
    return make_gateway(fake_policy_file, scorer="none", max_messages=4, max_tokens_cap=10, deadline_s=0.5)


def _post(gateway: Gateway, **body: object) -> httpx.Response:
    payload = {"model": "micro", "messages": [{"role": "user", "content": "x"}], **body}
    return gateway.client.post("/v1/chat/completions", json=payload, timeout=10)


def test_too_many_messages(gateway: Gateway) -> None:
    r = _post(gateway, messages=[{"role": "user", "content": "x"}] * 5)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"


def test_max_tokens_clamped_to_the_cap(gateway: Gateway) -> None:
    assert _post(gateway, max_tokens=500).json()["usage"]["completion_tokens"] == 10
    assert _post(gateway).json()["usage"]["completion_tokens"] == 10  # no limit given: the cap applies
    assert _post(gateway, max_tokens=3).json()["usage"]["completion_tokens"] == 3


def test_deadline_gives_504(gateway: Gateway) -> None:
    r = _post(gateway, max_tokens=8, metadata={"fake_delay_ms": "200"})
    assert r.status_code == 504 and r.json()["error"]["code"] == "deadline_exceeded"
