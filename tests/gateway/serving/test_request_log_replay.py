"""The replay log end to end: a real gateway writes it (`request_log`), `cascade policy replay` reads it and
shows how a stricter policy would move that traffic and what it would cost."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import httpx
import pytest

from gateway.api.app import create_app
from gateway.cli import policy as cli
from gateway.settings import Settings
from policies.replay import parse_log
from tests.servers import serve

SHORT = [{"role": "user", "content": "hello there"}]  # length score 0.01: micro
LONG = [{"role": "user", "content": "explain " * 150}]  # length score 0.75: flagship


def _replay(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(["policy", "replay", *argv])
    code: int = args.func(args)
    return code


def test_the_gateway_writes_a_log_that_replay_reads(policy_file: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "requests.jsonl"
    settings = Settings(policy_path=policy_file, scorer="length", start_engines=False, ledger="memory",
                        home=tmp_path, request_log=log)
    sent = [("auto", SHORT, False), ("auto", LONG, False), ("auto", LONG, True), ("flagship", SHORT, False)]
    with serve(create_app(settings)) as url:
        for model, messages, stream in sent:
            body = {"model": model, "messages": messages, "stream": stream, "metadata": {"team": "audit"}}
            r = httpx.post(url + "/v1/chat/completions", json=body, timeout=10)
            assert r.status_code == 200, r.text
        deadline = time.monotonic() + 5  # accounting (and the log line) happens after the answer
        while len(log.read_text().splitlines()) < len(sent):
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
    with log.open(encoding="utf-8") as fh:
        entries = parse_log(fh, str(log))
    got = sorted((e.request["model"], e.pool, e.score is None, e.request["stream"]) for e in entries)
    assert got == sorted([("auto", "micro", False, False), ("auto", "flagship", False, False),
                          ("auto", "flagship", False, True), ("flagship", "flagship", True, False)])
    assert all(e.tenant == "default" and e.prompt_tokens > 0 and e.completion_tokens == 16 for e in entries)
    assert all(e.request["metadata"] == {"team": "audit"} for e in entries)

    strict = tmp_path / "strict.yaml"
    strict.write_text(policy_file.read_text().replace("threshold: 0.5", "threshold: 0.9"))
    assert _replay(str(strict), "--log", str(log)) == 0
    out = capsys.readouterr().out
    # the two long `auto` requests (0.75 < 0.9) move to micro; the pinned one stays on the flagship
    assert out.startswith(f"4 requests; 2 move pools (rows: recorded, columns: {strict})"), out
    assert "difference: -" in out
