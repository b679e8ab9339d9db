"""Run real ASGI servers (uvicorn) on free loopback ports, in a background thread, for tests."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from loadtest.private_redis import PrivateRedis
from loadtest.processes import free_port
from loadtest.processes import wait_ready as process_ready

__all__ = ["ROOT", "PrivateRedis", "alive", "fake_engine", "fake_upstream_process", "free_port", "serve",
           "start_fake_upstream", "start_gateway", "until", "until_async", "wait_ready"]

ROOT = Path(__file__).resolve().parents[1]


def fake_engine(spec: Any, port: int, models_dir: Path) -> list[str]:
    """A supervisor `CommandFactory`: the zero-latency fake upstream as the replica's process, serving the
    spec's `served_name` (the real supervisor runs it, only the command is swapped)."""
    return [sys.executable, "-m", "loadtest.fake_upstream", "--port", str(port), "--model", spec.served_name]


def start_fake_upstream(model: str, delay_ms: float = 0.0, max_running: int | None = None
                        ) -> tuple[subprocess.Popen[bytes], str]:
    """`python -m loadtest.fake_upstream` serving `model` on a free port, once it answers: (process, base URL). The
    caller stops the process."""
    port = free_port()
    cmd = [sys.executable, "-m", "loadtest.fake_upstream", "--port", str(port), "--model", model,
           "--delay-ms", str(delay_ms)] + ([] if max_running is None else ["--max-running", str(max_running)])
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    process_ready(url + "/health", proc, 30, f"fake engine {model}", lambda: "(its output is discarded)")
    return proc, url


@contextmanager
def fake_upstream_process(model: str, delay_ms: float = 0.0, max_running: int | None = None) -> Iterator[str]:
    """`start_fake_upstream` for the block: yields the base URL, stops the process after. Its streams keep their
    own clock whatever the test's process does (no interpreter lock shared with the test's client, as `serve`'s
    thread shares it)."""
    proc, url = start_fake_upstream(model, delay_ms, max_running)
    try:
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def until(check: Callable[[], bool], timeout: float = 20.0, describe: Callable[[], str] | None = None) -> None:
    """Poll `check` every 0.05 s; fail the test when it is not true within `timeout` seconds, with `describe()`
    (what was seen) as the message when given."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached" if describe is None else describe()
        time.sleep(0.05)


async def until_async(check: Callable[[], bool], timeout: float = 20.0, describe: Callable[[], str] | None = None,
                      poll_s: float = 0.05) -> None:
    """`until` for async tests: poll `check` every `poll_s` seconds without blocking the event loop (what the test
    waits for may run on it)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached" if describe is None else describe()
        await asyncio.sleep(poll_s)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@contextmanager
def serve(app: Any, port: int | None = None, **options: Any) -> Iterator[str]:
    """Serve `app` with uvicorn in a thread until the block ends; yields its base URL (https when `options`
    name an `ssl_certfile`). `options` are more `uvicorn.Config` arguments, overriding the defaults here."""
    port = port or free_port()
    settings: dict[str, Any] = {"log_level": "warning", "loop": "asyncio", "http": "httptools", "lifespan": "on"}
    config = uvicorn.Config(app, host="127.0.0.1", port=port, **(settings | options))
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    # a gateway with the classifier loads its ONNX embedder first: about 25 s idle, over 90 s on a loaded machine
    deadline = time.monotonic() + 180
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("test server did not start")
        time.sleep(0.02)
    try:
        yield f"{'https' if options.get('ssl_certfile') else 'http'}://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def wait_ready(base: str, proc: subprocess.Popen[bytes], timeout_s: float, log: Callable[[], str],
               poll_s: float = 0.1, workers: int = 1) -> None:
    """Poll `base`/readyz until it answers 200, from `workers` distinct workers (`serve --workers N`: each poll on a
    new connection, so a request the test sends next never waits on a worker still starting). Fails the test with
    `log()` (the process's output) if the process exits first or the time runs out."""
    deadline = time.monotonic() + timeout_s
    seen: set[str] = set()
    with httpx.Client(timeout=2) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"gateway exited early ({proc.returncode}):\n{log()[-4000:]}")
            try:
                reply = client.get(base + "/readyz", headers={"connection": "close"})
                if reply.status_code == 200:
                    seen.add(str(reply.json().get("worker")))
                    if len(seen) >= workers:
                        return
            except httpx.HTTPError:
                pass
            time.sleep(poll_s)
    raise AssertionError(f"gateway not ready in {timeout_s:.0f} s:\n{log()[-4000:]}")


def start_gateway(policy: Path, port: int, prefix: str, home: Path, env: Mapping[str, str] | None = None,
                  timeout_s: float = 60) -> subprocess.Popen[bytes]:
    """`cascade serve` in a subprocess on `port` (no engines, no scorer, the ledger under `prefix`), returned once
    ready; its log is `home/gateway.log` (a file, not a pipe: an unread pipe that fills up blocks the gateway)."""
    cmd = [sys.executable, "-m", "gateway", "serve", "--policy", str(policy), "--port", str(port), "--scorer",
           "none", "--no-engines", "--redis-prefix", prefix, "--log-level", "WARNING"]
    home.mkdir(parents=True, exist_ok=True)
    log_path = home / "gateway.log"
    with log_path.open("ab") as log_file:
        proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "CASCADE_HOME": str(home), **(env or {})},
                                stdout=subprocess.DEVNULL, stderr=log_file)

    def log() -> str:
        proc.kill()
        return log_path.read_text(errors="replace")

    try:
        wait_ready(f"http://127.0.0.1:{port}", proc, timeout_s, log)
    except BaseException:
        proc.kill()
        raise
    return proc


