"""The access log: one JSON line per request through a real gateway (answered, streamed, refused), with the
ledger's tokens and cost and no prompt or answer text; sampling keeps the share it is told."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from gateway.api.app import create_app
from gateway.api.auth import hash_key
from gateway.api.runtime import Runtime
from gateway.ledger.store import MemoryLedger
from gateway.serving.access_log import AccessLog
from gateway.settings import Settings
from loadtest.fake_upstream import FakeUpstream
from tests.conftest import policy_yaml
from tests.gateway.ledger.test_ledger import make_record
from tests.servers import serve

Upstreams = tuple[FakeUpstream, str, FakeUpstream, str]
SECRET = "the quarterly numbers of zebra-plum"  # prompt text that must never reach the log
TENANTS = f"""tenants:
  acme: {{api_key_sha256: ['{hash_key("sk-acme")}']}}
"""


def _lines(path: Path, n: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 10
    while (len(text := path.read_text().splitlines()) < n) and time.monotonic() < deadline:
        time.sleep(0.05)  # answered lines follow the cost record, written in the background
    return [orjson.loads(line) for line in text]


def test_one_line_per_request_with_the_ledgers_figures_and_no_text(tmp_path: Path, upstreams: Upstreams) -> None:
    _, micro_url, _, flagship_url = upstreams
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml(micro_url, flagship_url) + TENANTS)
    log = tmp_path / "logs" / "access.jsonl"
    settings = Settings(policy_path=policy, scorer="none", start_engines=False, ledger="memory", home=tmp_path,
                        access_log=str(log))
    app = create_app(settings)
    body = {"model": "flagship", "messages": [{"role": "user", "content": SECRET}], "max_tokens": 8}
    auth = {"authorization": "Bearer sk-acme"}
    with serve(app) as url:
        plain = httpx.post(url + "/v1/chat/completions", json=body, headers=auth, timeout=30)
        streamed = httpx.post(url + "/v1/chat/completions", json={**body, "stream": True}, headers=auth, timeout=30)
        unknown = httpx.post(url + "/v1/chat/completions", json=body, headers={"authorization": "Bearer sk-no"})
        no_model = httpx.post(url + "/v1/chat/completions", json={**body, "model": "nope"}, headers=auth)
        lines = _lines(log, 4)
        runtime: Runtime = app.state.runtime
        assert isinstance(runtime.ledger, MemoryLedger)
        records = runtime.ledger.records
    codes = [plain.status_code, streamed.status_code, unknown.status_code, no_model.status_code]
    assert codes == [200, 200, 401, 404]
    assert len(lines) == 4 and SECRET.split()[-1] not in log.read_text() and "sk-acme" not in log.read_text()
    by_id = {line["request_id"]: line for line in lines}
    for reply in (plain, streamed):
        line, rec = by_id[reply.headers["x-request-id"]], records[reply.headers["x-request-id"]]
        assert (line["status"], line["outcome"], line["tenant"], line["pool"]) == (200, "ok", "acme", "flagship")
        assert line["key_id"] == hash_key("sk-acme")[:12] and line["endpoint"] == "chat"
        assert (line["prompt_tokens"], line["completion_tokens"], line["cost_micro_usd"]) == (
            rec.prompt_tokens, rec.completion_tokens, rec.cost_micro_usd) and rec.cost_micro_usd > 0
        assert line["latency_ms"] > 0 and line["ts"].endswith("Z")
        assert (line["ttft_ms"] is not None) == (reply is streamed)  # a JSON answer has no first token
    refused = by_id[unknown.headers["x-request-id"]]
    assert (refused["status"], refused["outcome"], refused["tenant"]) == (401, "invalid_api_key", "unknown")
    assert refused["key_id"] == hash_key("sk-no")[:12] and refused["cost_micro_usd"] is None
    assert by_id[no_model.headers["x-request-id"]]["status"] == 404


def test_sampling_keeps_the_share_it_is_told(tmp_path: Path) -> None:
    draws = iter([0.05, 0.95, 0.2, 0.7] * 25)
    log = AccessLog(str(tmp_path / "a.jsonl"), sample=0.5, draw=lambda: next(draws))
    for i in range(100):
        rec = make_record(i)
        log.begin(rec.request_id, "", "chat")
        log.answered(rec)
    log.close()
    assert len((tmp_path / "a.jsonl").read_text().splitlines()) == 50
