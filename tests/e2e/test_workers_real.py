"""`cascade serve --workers 2` with a local pool of a real vLLM engine (demo micro model): the parent
starts the engine once; both workers serve requests through it; SIGTERM stops workers and engine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import redis

from loadtest.fake_upstream import FakeUpstream
from tests.conftest import SHARED_URL
from tests.engines import own_micro_engine_policy
from tests.servers import free_port, serve, until

pytestmark = [pytest.mark.engines, pytest.mark.redis]
ROOT = Path(__file__).resolve().parents[2]
ENGINE = b"vllm.entrypoints.openai.api_server"


def _children(pid: int) -> dict[int, bytes]:
    pids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return {int(p): Path(f"/proc/{p}/cmdline").read_bytes() for p in pids}


def test_two_workers_share_one_supervised_engine(tmp_path: Path, prefix: str) -> None:
    engine_port, port = free_port(), free_port()
    with serve(FakeUpstream("flagship-model")) as flagship_url:
        policy = tmp_path / "policy.yaml"
        policy.write_text(own_micro_engine_policy(engine_port, flagship_url))
        cmd = [sys.executable, "-m", "gateway", "serve", "--workers", "2", "--policy", str(policy), "--port", str(port),
               "--scorer", "none", "--redis-prefix", prefix, "--log-format", "plain"]
        log_path = tmp_path / "gateway.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                    env={**os.environ, "HF_HUB_OFFLINE": "1"})
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 600
            while not _ready(base):
                assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
                time.sleep(1)
            children = _children(proc.pid)
            assert sum(ENGINE in c for c in children.values()) == 1  # one engine, started by the parent
            assert sum(b"spawn_main" in c for c in children.values()) == 2
            body = {"model": "micro", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
            for _ in range(20):  # new connections: the kernel spreads them over both workers
                r = httpx.post(base + "/v1/chat/completions", json=body, timeout=60)
                assert r.status_code == 200 and r.headers["x-cascade-pool"] == "micro", r.text
            reports = redis.Redis.from_url(SHARED_URL)
            until(lambda: len(reports.hgetall(prefix + "ladder:{sync}:reports")) == 2, timeout=10)  # both report
            engine_pid = next(p for p, c in children.items() if ENGINE in c)
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=120)
            print(log_path.read_text()[-2000:])
        assert code == 0
        assert not Path(f"/proc/{engine_pid}").exists()  # the engine stopped with the parent


def _ready(base: str, answers: int = 12) -> bool:
    """Ready on `answers` fresh connections in a row. The kernel spreads connections over the workers, and each
    worker probes the engine on its own schedule: one ready worker does not make the other ready yet."""
    try:
        return all(httpx.get(base + "/readyz", timeout=2).status_code == 200 for _ in range(answers))
    except httpx.HTTPError:
        return False
