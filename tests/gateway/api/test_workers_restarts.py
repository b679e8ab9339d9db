"""`serve --workers 2` with a local pool: the parent supervises the engine, and the restart it makes is counted
once in `cascade_engine_restarts_total`, whichever worker answers `/metrics`; an engine restarted on another
port (its own taken meanwhile) is served from there by every worker. The engine is the fake upstream
(a real HTTP server process on the engine's port, started and restarted by the real supervisor)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import delete_prefix
from tests.servers import free_port, wait_ready

pytestmark = pytest.mark.redis
ROOT = Path(__file__).resolve().parents[3]
DRIVER = """
import asyncio, sys
from pathlib import Path
from gateway.api.workers import WorkerGroup
from gateway.logs import configure_logging
from gateway.settings import Settings

def fake_engine(spec, port, models):
    return [sys.executable, "-m", "loadtest.fake_upstream", "--port", str(port), "--model", spec.served_name]

configure_logging("WARNING", json=False)
settings = Settings(policy_path=Path(sys.argv[1]), home=Path(sys.argv[2]), redis_prefix=sys.argv[3], scorer="none",
                    probe_interval_s=0.25, policy_watch_interval_s=0.25)  # probes, gauges and the file: 4x a second
group = WorkerGroup(settings, "127.0.0.1", int(sys.argv[4]), 2, "WARNING", False, command=fake_engine)
sys.exit(asyncio.run(group.run()))
"""


def workers_policy(engine_port: int, pool_extra: str = "") -> str:
    """One fake-engine micro pool on `engine_port`; `pool_extra`: more lines of the pool (indented 4)."""
    return f"""
version: 1
pools:
  micro:
    type: local
    price: {{gpu_hour_usd: "1.00", tokens_per_second: 100}}
    engine: {{model: fake, served_name: micro-model, base_port: {engine_port}, startup_timeout_s: 60}}
{pool_extra}routing: {{micro_pool: micro, flagship_pool: micro, threshold: 0.5}}
"""



class Group:
    def __init__(self, url: str, proc: subprocess.Popen[bytes], engine_port: int) -> None:
        self.url, self.proc, self.engine_port = url, proc, engine_port

    def engine_pids(self) -> list[int]:
        """Pids of the fake engine processes (children of the parent, beside the workers). A child that exits
        between the two reads (the killed engine, reaped) is not one."""
        text = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        return [int(p) for p in text.split() if b"loadtest.fake_upstream" in _cmdline(int(p))]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):  # it exited after the parent's children were read
        return b""


def serve_group(tmp_path: Path, policy_for: Callable[[int], str]) -> Iterator[Group]:
    """`serve --workers 2` (DRIVER) on the policy `policy_for(engine_port)`, ready; stopped by SIGTERM (exit 0
    asserted) and its Redis prefix deleted after. A fixture's body: yields once."""
    prefix = f"test:{uuid.uuid4().hex}:"
    policy = tmp_path / "policy.yaml"
    engine_port = free_port()
    policy.write_text(policy_for(engine_port))
    port = free_port()
    while port == engine_port:  # neither is bound yet: two draws can meet
        port = free_port()
    log = (tmp_path / "gateway.log").open("wb")
    cmd = [sys.executable, "-c", DRIVER, str(policy), str(tmp_path), prefix, str(port)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ), stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, 90, (tmp_path / "gateway.log").read_text)
        yield Group(url, proc, engine_port)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        log.close()
        delete_prefix(prefix)


@pytest.fixture
def group(tmp_path: Path) -> Iterator[Group]:
    yield from serve_group(tmp_path, workers_policy)


def _restarts(text: str) -> float:
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "cascade_engine_restarts_total" and s.labels == {"pool": "micro", "reason": "exited"})


def _healthy(url: str) -> list[tuple[str, str, float]]:
    """`cascade_replica_healthy` of the micro pool on one scrape: (worker, replica URL, value) per series."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return [(s.labels.get("worker", ""), s.labels["replica"], s.value) for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == "cascade_replica_healthy" and s.labels.get("pool") == "micro"]


def _replicas(url: str) -> set[str]:
    return {replica for _, replica, _ in _healthy(url)}


def _routed_by_worker(url: str) -> dict[str, bool]:
    """Per worker: whether its view holds a healthy replica (each worker publishes its view every second)."""
    seen: dict[str, bool] = {}
    for worker, _, value in _healthy(url):
        seen[worker] = seen.get(worker, False) or value == 1.0
    return seen


def test_a_restart_by_the_parent_is_counted_once_on_every_scrape(group: Group) -> None:
    (engine,) = group.engine_pids()
    assert _restarts(httpx.get(group.url + "/metrics", timeout=10).text) == 0
    os.kill(engine, signal.SIGKILL)
    scrapes: list[float] = []
    deadline = time.monotonic() + 30
    while len(scrapes) < 10:
        counted = _restarts(httpx.get(group.url + "/metrics", timeout=10).text)  # a new connection: any worker
        if scrapes or counted > 0 or time.monotonic() > deadline:
            scrapes.append(counted)
        time.sleep(0.05)
    assert scrapes == [1.0] * 10
    deadline = time.monotonic() + 30
    while not (pids := group.engine_pids()) or pids == [engine]:
        assert time.monotonic() < deadline, "the engine was never restarted"
        time.sleep(0.2)


@pytest.mark.slow
def test_every_worker_follows_an_engine_restarted_on_another_port(group: Group) -> None:
    (engine,) = group.engine_pids()
    os.kill(engine, signal.SIGKILL)
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    deadline = time.monotonic() + 10
    while True:  # take the engine's port before the parent restarts it (its first restart waits 1 s)
        try:
            holder.bind(("127.0.0.1", group.engine_port))
            break
        except OSError:
            assert time.monotonic() < deadline, "the killed engine's port was never free"
            time.sleep(0.02)
    holder.listen()
    try:
        deadline = time.monotonic() + 60
        while not (pids := group.engine_pids()) or pids == [engine]:
            assert time.monotonic() < deadline, "the engine was never restarted"
            time.sleep(0.2)
        body = {"model": "micro", "messages": [{"role": "user", "content": "hi"}]}
        deadline = time.monotonic() + 30
        while httpx.get(group.url + "/readyz", timeout=10).status_code != 200:
            assert time.monotonic() < deadline, "no worker became ready on the new port"
            time.sleep(0.2)
        old = f"http://127.0.0.1:{group.engine_port}"
        deadline = time.monotonic() + 30
        while _routed_by_worker(group.url) != {"0": True, "1": True} or old in _replicas(group.url):
            assert time.monotonic() < deadline, f"not every worker followed the move: {_replicas(group.url)}"
            time.sleep(0.2)
        codes = [httpx.post(group.url + "/v1/chat/completions", json=body, timeout=10).status_code
                 for _ in range(40)]  # a new connection each: the kernel spreads them over both workers
        assert codes == [200] * 40
    finally:
        holder.close()


@pytest.mark.slow
def test_an_engine_change_in_the_policy_file_reaches_the_parent_and_loses_no_request(
        group: Group, tmp_path: Path) -> None:
    (old,) = group.engine_pids()
    policy = tmp_path / "policy.yaml"
    body = {"model": "micro", "messages": [{"role": "user", "content": "hi"}],
            "metadata": {"fake_tokens": "6", "fake_delay_ms": "20"}}
    codes: list[int] = []
    policy.write_text(policy.read_text().replace("startup_timeout_s: 60}",
                                                 "startup_timeout_s: 60, max_model_len: 2048}"))
    deadline = time.monotonic() + 60
    with httpx.Client(timeout=10) as client:
        while True:  # steady traffic over both workers while the parent starts the new engine beside the old
            codes.append(client.post(group.url + "/v1/chat/completions", json=body,
                                     headers={"connection": "close"}).status_code)
            pids = group.engine_pids()
            if old not in pids and pids:
                break
            assert time.monotonic() < deadline, f"the old engine never stopped (engines: {pids})"
        for _ in range(20):  # and on the new one, from every worker
            codes.append(client.post(group.url + "/v1/chat/completions", json=body,
                                     headers={"connection": "close"}).status_code)
    assert set(codes) == {200} and len(codes) > 20
    (new,) = group.engine_pids()
    assert new != old  # the parent started the new version, then stopped the old one once drained
