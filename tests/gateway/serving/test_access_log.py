"""The access log: one JSON line per request through a real gateway (answered, streamed, refused), with the
ledger's tokens and cost and no prompt or answer text; sampling keeps the share it is told. A reader that stops
reading (a pipe nobody reads) costs lines, counted, never a request; a write that fails changes nothing else."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import select
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from gateway.api.app import create_app
from gateway.api.auth import hash_key
from gateway.api.runtime import Runtime
from gateway.ledger.store import CostRecord, MemoryLedger
from gateway.serving.records.access_log import AccessLog
from gateway.serving.records.accounting import Accountant
from gateway.serving.records.tracing import Tracing
from gateway.settings import Settings
from tests.conftest import Upstreams, policy_yaml
from tests.gateway.ledger.test_ledger import make_record
from tests.servers import serve, until

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


@contextmanager
def _fifo_nobody_reads(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """A named pipe with a reader that never reads: (its path, the reader's descriptor). Closing the reader at the
    end turns a write blocked on it into a broken-pipe error, so that a writer stuck there ends."""
    path = tmp_path / "access.fifo"
    os.mkfifo(path)
    reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        yield path, reader
    finally:
        with suppress(OSError):
            os.close(reader)


def _drain(reader: int) -> bytes:
    out = b""
    with suppress(BlockingIOError):
        while chunk := os.read(reader, 1 << 16):
            out += chunk
    return out


def test_a_reader_that_stops_reading_never_holds_the_caller(tmp_path: Path) -> None:
    dropped: dict[str, int] = {}
    n, capacity = 2_000, 100  # ~700 KB of lines: ten times what the pipe holds, and the queue holds 100

    def count(reason: str, lines: int) -> None:
        dropped[reason] = dropped.get(reason, 0) + lines

    with _fifo_nobody_reads(tmp_path) as (path, reader):
        log = AccessLog(str(path), capacity=capacity, on_dropped=count)

        def traffic() -> None:
            for i in range(n):
                rec = make_record(i)
                log.begin(rec.request_id, "0123456789ab", "chat")
                log.answered(rec)

        caller = threading.Thread(target=traffic, daemon=True)
        caller.start()
        caller.join(timeout=20)
        assert not caller.is_alive(), "the caller waited for a reader that does not read"
        assert dropped.get("full", 0) >= n - capacity - 1_000  # the pipe holds ~200 lines, the queue 100
        select.select([reader], [], [], 5)  # the writer lets lines gather for `LINGER_S` before it writes
        written = _drain(reader).splitlines()
        assert written and all(orjson.loads(line)["request_id"].startswith("r") for line in written)  # whole lines
        assert len(written) + dropped["full"] <= n
        began = time.monotonic()
        log.close(flush_s=0.5)  # the reader read once, then stalls again: close gives up after flush_s
        assert time.monotonic() - began < 5


def test_a_write_error_is_logged_once_and_changes_nothing_else(tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    class Told(Tracing):
        def __init__(self) -> None:
            super().__init__()
            self.ended: list[str] = []

        def answered(self, rec: CostRecord) -> None:
            self.ended.append(rec.request_id)

    with _fifo_nobody_reads(tmp_path) as (path, reader):
        access = AccessLog(str(path))
        os.close(reader)  # the reader is gone: every write fails (EPIPE)
        ledger, tracing = MemoryLedger(), Told()
        accountant = Accountant(ledger, access_log=access)
        accountant.tracing = tracing

        async def record_all() -> None:
            for i in range(20):
                rec = make_record(i)
                access.begin(rec.request_id, "", "chat")
                accountant.spawn(accountant.record_priced(rec))
            await accountant.drain()

        with caplog.at_level(logging.INFO):
            asyncio.run(record_all())
            access.close()
    assert len(ledger.records) == 20 and len(tracing.ended) == 20  # every request recorded, every span ended
    failures = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.name for r in failures] == ["cascade.logs"], [r.getMessage() for r in failures]  # once, nothing else


def test_a_gateway_whose_access_log_reader_stalls_answers_records_and_stays_ready(tmp_path: Path,
                                                                                 upstreams: Upstreams) -> None:
    _, micro_url, _, flagship_url = upstreams
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml(micro_url, flagship_url))
    n = 600  # ~200 KB of lines: three times what the pipe holds
    with _fifo_nobody_reads(tmp_path) as (path, _):
        settings = Settings(policy_path=policy, scorer="none", start_engines=False, ledger="memory", home=tmp_path,
                            access_log=str(path), access_log_buffer=50)
        app = create_app(settings)
        body = {"model": "flagship", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
        with serve(app) as url, httpx.Client(base_url=url, timeout=10) as client:
            codes = []
            for i in range(n):
                codes.append(client.post("/v1/chat/completions", json=body).status_code)
                if i % 100 == 0:
                    assert client.get("/readyz").status_code == 200
            assert codes == [200] * n
            assert client.get("/readyz").status_code == 200
            ledger = app.state.runtime.ledger
            assert isinstance(ledger, MemoryLedger)
            until(lambda: len(ledger.records) == n)
            metrics = client.get("/metrics").text
    dropped = re.search(r'^cascade_access_log_dropped_total\{reason="full"\} (\S+)$', metrics, re.MULTILINE)
    assert dropped is not None and 0 < float(dropped.group(1)) < n  # the pipe and the queue took the others
