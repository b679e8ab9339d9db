"""Processes of the overhead benchmark: free ports, starting and stopping process groups, readiness polling,
the gateway in front of an upstream, and cleaning the benchmark's Redis keys."""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from policies.schema import EngineSpec

__all__ = [
    "Env",
    "Procs",
    "cleanup_redis",
    "cpu_seconds",
    "demo_engine_spec",
    "engine_process",
    "free_port",
    "gateway_command",
    "group_cpu",
    "http_get",
    "policy_text",
    "post_json",
    "start_fake_upstream",
    "start_gateway",
    "wait_ready",
]


_LOW_PORT = 20000  # free ports are drawn from here up to the kernel's ephemeral range


def _ephemeral_low(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> int:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _slice(start: int, stop: int) -> tuple[int, int]:
    """This pytest-xdist worker's share of the ports [start, stop) (`PYTEST_XDIST_WORKER` gwN of
    `PYTEST_XDIST_WORKER_COUNT`, which its child processes inherit); the whole range outside xdist."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else -1
    if not (count.isdigit() and 0 <= index < int(count)):
        return start, stop
    size = (stop - start) // int(count)
    return start + index * size, start + (index + 1) * size


def free_port() -> int:
    """A loopback port free now, for a server about to be started on it. Drawn at random below the kernel's
    ephemeral range where that leaves room: outgoing connections take their source ports from that range, so on a
    busy host (the test suite's parallel workers) one took a port chosen by binding port 0 before the server that
    was to listen there bound it ("address already in use"). Under pytest-xdist each worker draws from its own
    slice of that range (`_slice`): two workers' draws met once, one's gateway then found its port taken."""
    import random
    import socket

    start, stop = _slice(_LOW_PORT, _ephemeral_low())
    draw = random.SystemRandom()
    for _ in range(100 if stop - start >= 1000 else 0):
        port = draw.randrange(start, stop)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        chosen: int = sock.getsockname()[1]
        return chosen


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process (Linux /proc); 0.0 where unavailable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def demo_engine_spec(model: str = "demo:micro") -> EngineSpec:
    """The engine a bench starts by itself, served as `micro`: `model` (a demo model is built first if missing) in
    bfloat16, eager, 1,024 tokens of context and 1 GiB of KV cache, as the shipped micro pool runs it."""
    from backends.models.demo import ensure_demo_models
    from policies.schema import EngineSpec

    if model.startswith("demo:"):
        ensure_demo_models()
    return EngineSpec(model=model, served_name="micro", max_model_len=1024, dtype="bfloat16", kv_cache_space_gib=1,
                      extra_args=("--enforce-eager",))


@contextlib.contextmanager
def engine_process(spec: EngineSpec, env: dict[str, str], log: Path, what: str) -> Iterator[tuple[str, int]]:
    """A vLLM engine for `spec` on a free port, as the supervisor renders it, with `env` over this environment,
    its output in `log`: its URL and process group once `/health` answers; SIGTERM to the group on exit."""
    from backends.engines.args import engine_command, engine_env

    port = free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen(engine_command(spec, port), stdout=out, stderr=subprocess.STDOUT,
                                env=os.environ | engine_env(spec) | env, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url + "/health", proc, 600, what, lambda: log.read_text()[-3000:])
        yield url, proc.pid  # its own session: the group id is its pid
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


def group_cpu(pgid: int) -> dict[str, float]:
    """CPU seconds so far of each live process in the process group `pgid`, summed by its name (`comm`; a Python
    process is "API server": in an engine's group that is vLLM's)."""
    found: dict[str, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != pgid:
                continue
            name = (entry / "comm").read_text().strip()
        except (OSError, ProcessLookupError):
            continue
        name = "API server" if name.startswith("python") else name
        found[name] = found.get(name, 0.0) + cpu_seconds(int(entry.name))
    return found


class Procs:
    """The processes this benchmark started. Each runs in its own session; `stop_all` ends the groups."""

    def __init__(self, log_dir: Path) -> None:
        self._log_dir = log_dir
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, cmd: Sequence[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        with (self._log_dir / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env={**os.environ, **(env or {})}, start_new_session=True)
        self._procs[name] = proc
        return proc

    def pid(self, name: str) -> int:
        """The PID of the running process `name` (also its process group id)."""
        return self._procs[name].pid

    def log_tail(self, name: str, limit: int = 3000) -> str:
        path = self._log_dir / f"{name}.log"
        return path.read_text(errors="replace")[-limit:] if path.exists() else ""

    def stop(self, name: str, grace_s: float = 15.0) -> None:
        proc = self._procs.pop(name, None)
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # stragglers of the group, if any
        proc.wait()

    def stop_all(self) -> None:
        for name in list(self._procs):
            self.stop(name)


def http_get(url: str, timeout_s: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return int(resp.status), bytes(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float, what: str, tail: Callable[[], str]) -> None:
    """Poll `url` until it answers 200; raise with the log tail if the process exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode}:\n{tail()}")
        with contextlib.suppress(OSError):
            if http_get(url)[0] == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{what} not ready at {url} after {timeout_s:.0f} s:\n{tail()}")


def post_json(url: str, body: bytes, timeout_s: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, data=body, headers={"content-type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return int(resp.status), dict(resp.headers.items()), bytes(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers.items()), exc.read()


# ------------------------------------------------------------------------------------------ gateway

_FALLBACK_SERVE = (
    "import sys; from pathlib import Path; import uvicorn; from gateway.api.app import create_app; "
    "from gateway.logs import configure_logging; from gateway.settings import Settings; a = sys.argv[1:]; "
    "configure_logging(a[4], json=False); "
    "uvicorn.run(create_app(Settings(policy_path=Path(a[0]), scorer='none', start_engines=False, "
    "transport=a[2], redis_prefix=a[3], ledger=a[5])), host='127.0.0.1', port=int(a[1]), loop='uvloop', "
    "http='httptools', log_level='warning', access_log=False)"
)


def gateway_command(policy: Path, port: int, transport: str, prefix: str, log_level: str,
                    ledger: str = "redis", launcher: str | None = None, scorer: str = "none",
                    extra: Sequence[str] = ()) -> tuple[list[str], str]:
    """argv of one gateway worker; falls back to the same uvicorn call when `python -m gateway` cannot import
    (the CLI needs `gateway.costs.cli`, which may not exist yet). `launcher` replaces `python -m gateway`
    (A/B runs of a patched build); `extra` is appended to `serve`'s flags. Returns (argv, launcher name)."""
    serve = ["serve", "--policy", str(policy), "--port", str(port), "--scorer", scorer, "--no-engines",
             "--log-level", log_level, "--transport", transport, "--redis-prefix", prefix, "--ledger", ledger,
             *extra]
    if launcher:
        return [*shlex.split(launcher), *serve], launcher
    if find_spec("gateway.costs.cli") is not None:
        return [sys.executable, "-m", "gateway", *serve], "python -m gateway serve"
    args = [str(policy), str(port), transport, prefix, log_level, ledger]
    return [sys.executable, "-c", _FALLBACK_SERVE, *args], "uvicorn fallback (gateway.costs.cli missing)"


def policy_text(micro_url: str, micro_model: str, flagship_url: str, flagship_model: str) -> str:
    """Two `type: remote` pools (the format of tests/conftest.py)."""
    return f"""version: 1
pools:
  micro:
    type: remote
    urls: ["{micro_url}"]
    model: {micro_model}
    price: {{input_per_mtok: "0.20", output_per_mtok: "0.20"}}
  flagship:
    type: remote
    urls: ["{flagship_url}"]
    model: {flagship_model}
    price: {{input_per_mtok: "3.00", output_per_mtok: "15.00"}}
routing:
  micro_pool: micro
  flagship_pool: flagship
  threshold: 0.5
"""


@dataclass
class Env:
    """What both phases share: args, temp dir, processes, the Redis prefix, the gateway launcher used."""

    args: argparse.Namespace
    tmp: Path
    procs: Procs
    prefix: str
    launcher: str = ""


def start_gateway(env: Env, name: str, upstream_url: str, model: str, transport: str) -> tuple[str, int]:
    """Start one gateway in front of `upstream_url`; returns (base URL, pid) once /readyz is 200."""
    policy = env.tmp / f"{name}.yaml"
    policy.write_text(policy_text(upstream_url, model, upstream_url, model))
    port = free_port()
    args = env.args
    cmd, env.launcher = gateway_command(policy, port, transport, env.prefix, args.gateway_log_level, args.ledger,
                                        args.gateway_cmd)
    extra = {"CASCADE_HOME": str(env.tmp / f"{name}-home"), "CASCADE_REDIS_URL": args.redis_url}
    proc = env.procs.start(name, cmd, extra)
    base = f"http://127.0.0.1:{port}"
    wait_ready(base + "/readyz", proc, args.ready_timeout, f"gateway {name}", lambda: env.procs.log_tail(name))
    return base, proc.pid


def start_fake_upstream(env: Env, name: str, args: Sequence[str] = ()) -> tuple[str, int]:
    """A zero-latency fake vLLM upstream (`loadtest.fake_upstream`, serving `fake-model`, with `args`) as
    `env.procs`' process `name`; returns (base URL, pid) once it answers /health."""
    port = free_port()
    proc = env.procs.start(name, [sys.executable, "-m", "loadtest.fake_upstream", "--port", str(port),
                                  "--model", "fake-model", *args])
    base = f"http://127.0.0.1:{port}"
    wait_ready(base + "/health", proc, env.args.ready_timeout, "fake upstream", lambda: env.procs.log_tail(name))
    return base, proc.pid


def cleanup_redis(url: str, prefix: str) -> int:
    """Delete the keys under `prefix` (SCAN + DEL, that prefix only). Returns how many were deleted."""
    import redis

    client = redis.Redis.from_url(url)
    deleted = 0
    try:
        batch: list[bytes] = []
        for key in client.scan_iter(match=f"{prefix}*", count=1000):
            batch.append(key)
            if len(batch) >= 500:
                deleted += int(client.delete(*batch))
                batch = []
        if batch:
            deleted += int(client.delete(*batch))
    finally:
        client.close()
    return deleted
