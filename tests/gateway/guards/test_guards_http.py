"""Input guards through a real gateway (uvicorn) over fake engines: what the engine receives, what the client
gets (status, error body, x-cascade-guard), what /metrics counts, and that no prompt text reaches the logs."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from gateway.api.app import create_app
from gateway.api.auth import hash_key
from gateway.settings import Settings
from loadtest.fake_upstream import FakeUpstream
from tests.conftest import policy_yaml
from tests.servers import serve, until

CARD = "4111 1111 1111 1111"
TENANTS = f"""tenants:
  redacting:
    api_key_sha256: ['{hash_key("sk-redact")}']
    guards:
      pii: {{action: redact}}
  refusing:
    api_key_sha256: ['{hash_key("sk-refuse")}']
    guards:
      pii: {{action: refuse, kinds: [card, iban]}}
      max_prompt_chars: 2000
      languages: [en]
  open:
    api_key_sha256: ['{hash_key("sk-open")}']
"""


class Served:
    def __init__(self, url: str, micro: FakeUpstream, log_path: Path) -> None:
        self.url, self.micro, self.log_path = url, micro, log_path

    def chat(self, key: str, messages: list[dict[str, Any]], **body: Any) -> httpx.Response:
        return httpx.post(self.url + "/v1/chat/completions", json={"model": "micro", "messages": messages, **body},
                          headers={"authorization": f"Bearer {key}"}, timeout=10)

    def engine_messages(self) -> list[dict[str, Any]]:
        assert self.micro.last_body is not None
        return list(self.micro.last_body["messages"])


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("guards")
    micro = FakeUpstream("micro-model")
    with serve(micro) as micro_url, serve(FakeUpstream("flagship-model")) as flagship_url:
        path = tmp / "policy.yaml"
        path.write_text(policy_yaml(micro_url, flagship_url, TENANTS))
        log_path = tmp / "requests.jsonl"
        settings = Settings(policy_path=path, scorer="length", start_engines=False, ledger="memory", home=tmp,
                            request_log=log_path)
        with serve(create_app(settings)) as url:
            yield Served(url, micro, log_path)


def _user(content: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": content}]


def test_the_engine_sees_redacted_text(served: Served, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Escalate to ops@example.com"},
                {"role": "user", "content": [{"type": "text", "text": f"charge card {CARD} please"}]}]
    resp = served.chat("sk-redact", messages)
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-cascade-guard"] == "pii=redacted:email,card"
    assert served.engine_messages() == [
        {"role": "system", "content": "Escalate to [REDACTED:email]"},
        {"role": "user", "content": [{"type": "text", "text": "charge card [REDACTED:card] please"}]}]
    assert CARD not in caplog.text and "ops@example.com" not in caplog.text


def test_the_stream_is_guarded_too(served: Served) -> None:
    with httpx.stream("POST", served.url + "/v1/chat/completions", timeout=10,
                      json={"model": "micro", "stream": True, "messages": _user(f"my card: {CARD}")},
                      headers={"authorization": "Bearer sk-redact"}) as resp:
        assert resp.status_code == 200
        assert resp.headers["x-cascade-guard"] == "pii=redacted:card"
        assert any("[DONE]" in line for line in resp.iter_lines())
    assert served.engine_messages() == _user("my card: [REDACTED:card]")


def test_the_replay_log_holds_what_the_engine_saw(served: Served) -> None:
    served.chat("sk-redact", _user(f"log this card {CARD}"))

    def logged() -> bool:  # written once the request is accounted for, just after the answer
        lines = [orjson.loads(line) for line in served.log_path.read_bytes().splitlines()]
        return any(line["request"]["messages"] == _user("log this card [REDACTED:card]") for line in lines)

    until(logged, timeout=5)
    assert CARD.encode() not in served.log_path.read_bytes()


@pytest.mark.parametrize("stream", [False, True])
def test_refused_before_any_engine_call_naming_kinds_not_text(served: Served, stream: bool) -> None:
    before = served.micro.requests
    resp = served.chat("sk-refuse", _user(f"card {CARD}, IBAN DE89 3704 0044 0532 0130 00"), stream=stream)
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", "pii_detected", "messages")
    assert "card, iban" in error["message"]
    assert CARD not in resp.text and "DE89" not in resp.text
    # too few words to tell the language: let through to the PII guard, which refuses
    assert resp.headers["x-cascade-guard"] == "size=passed; language=passed; pii=refused:card,iban"
    assert served.micro.requests == before


def test_size_and_language_refusals(served: Served) -> None:
    big = served.chat("sk-refuse", _user("word " * 500))
    assert (big.status_code, big.json()["error"]["code"]) == (400, "prompt_too_large")
    assert big.headers["x-cascade-guard"] == "size=refused:chars"
    french = served.chat("sk-refuse", _user("Bonjour, je voudrais réserver une table pour deux personnes ce soir."))
    assert (french.status_code, french.json()["error"]["code"]) == (400, "language_not_allowed")
    ok = served.chat("sk-refuse", _user("Please book a table for two people tonight at the usual place."))
    assert ok.status_code == 200 and ok.headers["x-cascade-guard"] == "size=passed; language=passed:en; pii=passed"


def test_a_tenant_without_guards_is_served_as_sent(served: Served) -> None:
    resp = served.chat("sk-open", _user(f"card {CARD}"))
    assert resp.status_code == 200 and "x-cascade-guard" not in resp.headers
    assert served.engine_messages() == _user(f"card {CARD}")


def test_decisions_are_counted_without_prompt_text(served: Served) -> None:
    served.chat("sk-redact", _user(f"count this card {CARD}"))
    served.chat("sk-refuse", _user(f"and this one {CARD}"))
    metrics = httpx.get(served.url + "/metrics").text
    lines = [line for line in metrics.splitlines() if line.startswith("cascade_guard_decisions_total{")]
    assert lines, "no guard decisions in /metrics"
    counted = {line.split(" ")[0]: float(line.split(" ")[1]) for line in lines}
    assert counted['cascade_guard_decisions_total{action="redacted",guard="pii",kind="card",tenant="redacting"}'] >= 1
    assert counted['cascade_guard_decisions_total{action="refused",guard="pii",kind="card",tenant="refusing"}'] >= 1
    assert counted['cascade_guard_decisions_total{action="passed",guard="size",kind="none",tenant="refusing"}'] >= 1
    # the prompts' words and the card number, spaced or not ("4111" alone also turns up in a timestamp's digits)
    assert "count this card" not in metrics and "and this one" not in metrics
    assert CARD not in metrics and CARD.replace(" ", "") not in metrics
