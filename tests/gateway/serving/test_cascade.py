"""The true cascade over real HTTP with fake engines whose logprobs we control."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.api.app import create_app
from gateway.ledger.store import MemoryLedger
from gateway.serving.cascade import confidence
from gateway.settings import Settings
from loadtest.fake_upstream import FakeUpstream
from tests.conftest import policy_yaml
from tests.servers import serve

Upstreams = tuple[FakeUpstream, str, FakeUpstream, str]
CASCADE = """  cascade: {enabled: true, min_confidence: 0.5, first_tokens: 4}"""


@pytest.fixture
def gateway(tmp_path: Path, upstreams: Upstreams) -> Iterator[tuple[str, MemoryLedger]]:
    _, micro_url, _, flagship_url = upstreams
    path = tmp_path / "policy.yaml"
    path.write_text(policy_yaml(micro_url, flagship_url, CASCADE))
    settings = Settings(policy_path=path, scorer="length", start_engines=False, ledger="memory", home=tmp_path)
    app = create_app(settings)
    with serve(app) as url:
        yield url, app.state.runtime.ledger


def _records(ledger: MemoryLedger, n: int) -> dict[str, Any]:
    deadline = time.monotonic() + 5
    while len(ledger.records) < n and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(ledger.records) == n
    return dict(ledger.records)


def test_confidence_is_geometric_mean_probability() -> None:
    assert confidence([]) is None
    assert confidence([0.0, 0.0]) == 1.0
    assert abs((confidence([-0.1, -0.3]) or 0) - 0.8187) < 1e-3


def _body(logprob: float, stream: bool) -> dict[str, Any]:
    return {"model": "auto", "messages": [{"role": "user", "content": "hi"}], "stream": stream,
            "metadata": {"fake_logprob": str(logprob), "fake_tokens": "8"}}


@pytest.mark.parametrize("stream", [False, True])
def test_confident_micro_answer_is_kept(gateway: tuple[str, MemoryLedger], upstreams: Upstreams, stream: bool) -> None:
    url, ledger = gateway
    resp = httpx.post(url + "/v1/chat/completions", json=_body(-0.1, stream))
    assert resp.status_code == 200
    assert (resp.headers["x-cascade-pool"], resp.headers["x-cascade-escalated"]) == ("micro", "false")
    assert float(resp.headers["x-cascade-confidence"]) == pytest.approx(0.905, abs=1e-3)
    if not stream:
        assert resp.json()["choices"][0]["logprobs"] is None  # the client did not ask for them
    else:
        assert resp.text.count("\"content\":\" w") == 8  # held-back probe tokens were replayed, none lost
    (rec,) = _records(ledger, 1).values()
    assert rec.pool == "micro" and rec.completion_tokens == 8
    assert upstreams[2].requests == 0


@pytest.mark.parametrize("stream", [False, True])
def test_unsure_micro_answer_escalates_and_both_calls_are_charged(
    gateway: tuple[str, MemoryLedger], upstreams: Upstreams, stream: bool
) -> None:
    url, ledger = gateway
    resp = httpx.post(url + "/v1/chat/completions", json=_body(-3.0, stream))
    assert resp.status_code == 200
    assert (resp.headers["x-cascade-pool"], resp.headers["x-cascade-rule"]) == ("flagship", "cascade")
    assert resp.headers["x-cascade-escalated"] == "true"
    assert "flagship-model" in resp.text and "micro-model" not in resp.text  # no byte of the probe leaked
    rid = resp.headers["x-request-id"]
    records = _records(ledger, 2)
    probe, final = records[rid + "-probe"], records[rid]
    assert (probe.pool, probe.status) == ("micro", "escalated")
    assert probe.completion_tokens >= 4
    assert (final.pool, final.status, final.rule) == ("flagship", "ok", "cascade")
    assert upstreams[0].requests == 1 and upstreams[2].requests == 1
