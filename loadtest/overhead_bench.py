"""Gateway overhead benchmark (issue 2): the gateway next to its upstream called directly.

Part 1, non-streaming: a zero-latency fake vLLM upstream (`loadtest.fake_upstream`) and the gateway in
front of it (`python -m gateway serve --scorer none --no-engines`, one worker, real Redis ledger under a
throw-away key prefix) are driven by `wrk` at several concurrencies, direct and through the gateway
interleaved, for several rounds. Reported: requests/s, p50/p99 latency, added p50/p99 (gateway minus
direct, paired per round), gateway CPU per request, errors; and the ratio to LiteLLM's 85 requests/s.

Part 2, streaming: a real vLLM engine with the tiny demo "micro" model (started here, or `--engine-url`)
is called with closed-loop streaming requests (`loadtest.stream_client`) directly and through a gateway
with a pinned model name (no scoring), interleaved; reported: tokens/s, TTFT p50/p99, gateway/direct.

Targets (issue 2): gateway >= 850 requests/s (10x LiteLLM's 85) at concurrency 16 and 64; added p50
< 1.5 ms at concurrency 1; streaming tokens/s through the gateway >= 95% of direct. Results go to
`loadtest/results/overhead-<timestamp>.json`. Run `python -m loadtest.overhead_bench --help`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import orjson

__all__ = [
    "LITELLM_RPS",
    "WrkResult",
    "lua_script",
    "main",
    "parse_latency_ms",
    "parse_wrk",
    "summarise_nonstream",
    "summarise_stream",
    "top_frames",
]

LITELLM_RPS = 85.0
TARGET_RPS = 10 * LITELLM_RPS
TARGET_ADDED_P50_MS = 1.5
TARGET_STREAM_RATIO = 0.95
RESULTS_DIR = Path(__file__).resolve().parent / "results"
WRK_INSTALL_HINT = "wrk is not installed: `apt-get install -y wrk` (Debian/Ubuntu) or `brew install wrk` (macOS)"
_UNITS_MS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3, "h": 3600e3}
_LAT = re.compile(r"^\s*(50|75|90|99)(?:\.0+)?%\s+([0-9.]+)(us|ms|s|m|h)\s*$", re.MULTILINE)


# ---------------------------------------------------------------------------------------------- wrk


@dataclass(slots=True)
class WrkResult:
    """One wrk run. Latencies in ms; `non2xx` counts HTTP status >= 400; `socket_errors` sums connect, read
    and write errors; `timeouts` counts requests slower than wrk's --timeout (not failures of the server)."""

    rps: float
    p50_ms: float
    p99_ms: float
    requests: int
    duration_s: float
    non2xx: int
    socket_errors: int
    timeouts: int = 0


def parse_latency_ms(text: str) -> float:
    """wrk's time format ('206.12us', '1.20ms', '2.00s', '1.00m') in milliseconds."""
    match = re.fullmatch(r"\s*([0-9.]+)(us|ms|s|m|h)\s*", text)
    if match is None:
        raise ValueError(f"not a wrk latency: {text!r}")
    return float(match.group(1)) * _UNITS_MS[match.group(2)]


def _int_after(pattern: str, text: str) -> int:
    match = re.search(pattern, text)
    return int(match.group(1)) if match else 0


def parse_wrk(text: str) -> WrkResult:
    """Parse the output of `wrk --latency`. Raises ValueError when the summary lines are missing."""
    lat = {int(q): float(v) * _UNITS_MS[u] for q, v, u in _LAT.findall(text)}
    rps = re.search(r"^Requests/sec:\s+([0-9.]+)", text, re.MULTILINE)
    total = re.search(r"^\s*(\d+) requests in ([0-9.]+)(us|ms|s|m|h)", text, re.MULTILINE)
    if rps is None or total is None or 50 not in lat or 99 not in lat:
        raise ValueError(f"unexpected wrk output:\n{text}")
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    return WrkResult(
        rps=float(rps.group(1)), p50_ms=lat[50], p99_ms=lat[99], requests=int(total.group(1)),
        duration_s=float(total.group(2)) * _UNITS_MS[total.group(3)] / 1e3,
        non2xx=_int_after(r"Non-2xx or 3xx responses:\s+(\d+)", text),
        socket_errors=sum(int(g) for g in sock.groups()[:3]) if sock else 0,
        timeouts=int(sock.group(4)) if sock else 0,
    )


def chat_body(max_tokens: int = 16) -> bytes:
    """The non-streaming request: model 'auto', a short user message."""
    return orjson.dumps({"model": "auto", "max_tokens": max_tokens,
                         "messages": [{"role": "user", "content": "What is the capital of France?"}]})


def lua_script(body: bytes) -> str:
    """A wrk script that POSTs `body` as JSON (Lua long bracket: no escaping needed)."""
    text = body.decode()
    if "]==]" in text:
        raise ValueError("body must not contain ']==]'")
    return (f'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
            f"wrk.body = [==[{text}]==]\n")


def run_wrk(url: str, lua: Path, connections: int, duration_s: float, threads: int, timeout_s: float) -> WrkResult:
    """Run wrk against `url` (full URL) and parse it."""
    cmd = ["wrk", f"-t{min(threads, connections)}", f"-c{connections}", f"-d{duration_s:g}s",
           f"--timeout={timeout_s:g}s", "--latency", "-s", str(lua), url]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=duration_s + timeout_s + 30, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stderr or done.stdout}")
    return parse_wrk(done.stdout)


# ---------------------------------------------------------------------------------------- processes


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process (Linux /proc); 0.0 where unavailable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
    "import sys; from pathlib import Path; import uvicorn; from gateway.app import create_app; "
    "from gateway.logs import configure_logging; from gateway.settings import Settings; a = sys.argv[1:]; "
    "configure_logging(a[4], json=False); "
    "uvicorn.run(create_app(Settings(policy_path=Path(a[0]), scorer='none', start_engines=False, "
    "transport=a[2], redis_prefix=a[3], ledger=a[5])), host='127.0.0.1', port=int(a[1]), loop='uvloop', "
    "http='httptools', log_level='warning', access_log=False)"
)


def gateway_command(policy: Path, port: int, transport: str, prefix: str, log_level: str,
                    ledger: str = "redis", launcher: str | None = None) -> tuple[list[str], str]:
    """argv of one gateway worker; falls back to the same uvicorn call when `python -m gateway` cannot import
    (the CLI needs `gateway.costs_cli`, which may not exist yet). `launcher` replaces `python -m gateway`
    (A/B runs of a patched build). Returns (argv, launcher name)."""
    serve = ["serve", "--policy", str(policy), "--port", str(port), "--scorer", "none", "--no-engines",
             "--log-level", log_level, "--transport", transport, "--redis-prefix", prefix, "--ledger", ledger]
    if launcher:
        return [*shlex.split(launcher), *serve], launcher
    if find_spec("gateway.costs_cli") is not None:
        return [sys.executable, "-m", "gateway", *serve], "python -m gateway serve"
    args = [str(policy), str(port), transport, prefix, log_level, ledger]
    return [sys.executable, "-c", _FALLBACK_SERVE, *args], "uvicorn fallback (gateway.costs_cli missing)"


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


# --------------------------------------------------------------------------------- non-streaming phase


@dataclass(slots=True)
class Target:
    name: str
    url: str
    pid: int


def _check_target(target: Target, body: bytes) -> None:
    status, headers, payload = post_json(target.url, body)
    if status != 200 or b'"choices"' not in payload:
        raise RuntimeError(f"{target.name}: probe request failed: HTTP {status}: {payload[:300]!r}")
    if target.name != "direct" and "x-cascade-pool" not in {k.lower() for k in headers}:
        raise RuntimeError(f"{target.name}: no x-cascade-pool header; is this the gateway?")


def _measure(target: Target, lua: Path, conc: int, args: argparse.Namespace, rnd: int) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    cpu_before = cpu_seconds(target.pid)
    res = run_wrk(target.url, lua, conc, args.duration, args.wrk_threads, args.wrk_timeout)
    cpu = cpu_seconds(target.pid) - cpu_before
    cell = {"round": rnd, "target": target.name, "concurrency": conc, **asdict(res),
            "server_cpu_ms_per_req": 1000.0 * cpu / res.requests if res.requests else None,
            "loadavg_1m": [load_before, os.getloadavg()[0]]}
    errs = f" ERRORS non2xx={res.non2xx} socket={res.socket_errors}" if res.non2xx or res.socket_errors else ""
    errs += f" (timeouts > {args.wrk_timeout:g} s: {res.timeouts})" if res.timeouts else ""
    print(f"  round {rnd} c={conc:<3} {target.name:<12} {res.rps:9.0f} req/s  p50 {res.p50_ms:7.2f} ms  "
          f"p99 {res.p99_ms:7.2f} ms  cpu {cell['server_cpu_ms_per_req'] or 0:.2f} ms/req{errs}", flush=True)
    return cell


def _nonstream_targets(env: Env) -> list[Target]:
    args = env.args
    port = free_port()
    proc = env.procs.start("fake-upstream", [sys.executable, "-m", "loadtest.fake_upstream", "--port", str(port),
                                             "--model", "fake-model"])
    base = f"http://127.0.0.1:{port}"
    wait_ready(base + "/health", proc, args.ready_timeout, "fake upstream", lambda: env.procs.log_tail("fake-upstream"))
    chat = "/v1/chat/completions"
    targets = [Target("direct", base + chat, proc.pid)]
    for transport in args.transports:
        url, pid = start_gateway(env, f"gateway-{transport}", base, "fake-model", transport)
        targets.append(Target(f"gw-{transport}", url + chat, pid))
    return targets


def nonstream_phase(env: Env) -> dict[str, Any]:
    """Interleaved wrk cells: per round, per concurrency, direct then each gateway (order flipped on odd rounds)."""
    args = env.args
    targets = _nonstream_targets(env)
    lua = env.tmp / "wrk_post.lua"
    lua.write_text(lua_script(chat_body(args.max_tokens)))
    for target in targets:
        _check_target(target, chat_body(args.max_tokens))
        run_wrk(target.url, lua, 16, args.warmup, args.wrk_threads, args.wrk_timeout)  # warm-up, not recorded
    cells: list[dict[str, Any]] = []
    for rnd in range(1, args.rounds + 1):
        for conc in args.concurrency:
            order = targets if rnd % 2 else [targets[0], *reversed(targets[1:])]
            cells.extend(_measure(t, lua, conc, args, rnd) for t in order)
    profile = profile_gateway(env, targets[1], lua) if args.profile else None
    return {"cells": cells, "summary": summarise_nonstream(cells), "profile": profile}


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _gateway_row(cells: list[dict[str, Any]], gw: str, conc: int) -> dict[str, Any]:
    direct = {c["round"]: c for c in cells if c["target"] == "direct" and c["concurrency"] == conc}
    mine = [c for c in cells if c["target"] == gw and c["concurrency"] == conc]
    paired = [(c, direct[c["round"]]) for c in mine if c["round"] in direct]
    return {
        "target": gw, "concurrency": conc, "rounds": len(mine),
        "rps": _median([c["rps"] for c in mine]), "rps_all": [c["rps"] for c in mine],
        "p50_ms": _median([c["p50_ms"] for c in mine]), "p99_ms": _median([c["p99_ms"] for c in mine]),
        "added_p50_ms": _median([c["p50_ms"] - d["p50_ms"] for c, d in paired]),
        "added_p99_ms": _median([c["p99_ms"] - d["p99_ms"] for c, d in paired]),
        "cpu_ms_per_req": _median([c["server_cpu_ms_per_req"] for c in mine]),
        "errors": sum(c["non2xx"] + c["socket_errors"] for c in mine),
        "timeouts": sum(c.get("timeouts", 0) for c in mine),
    }


def summarise_nonstream(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (target, concurrency): medians over rounds; added latency = median of paired differences."""
    rows = []
    names = list(dict.fromkeys(c["target"] for c in cells))
    for conc in sorted({c["concurrency"] for c in cells}):
        for name in names:
            row = _gateway_row(cells, name, conc)
            if name != "direct":
                row["x_litellm"] = row["rps"] / LITELLM_RPS if row["rps"] is not None else None
            else:
                row["added_p50_ms"] = row["added_p99_ms"] = None
            rows.append(row)
    return rows


# ------------------------------------------------------------------------------------------ profiling


def _frame_key(frame: str) -> str:
    """'handle (gateway/service.py:93)' -> 'handle (gateway/service.py)': aggregate over lines."""
    return re.sub(r":\d+\)$", ")", frame.strip())


def top_frames(collapsed: str, n: int = 15) -> dict[str, list[tuple[str, float]]]:
    """From py-spy's raw (collapsed-stack) output: the top `n` functions by self and by inclusive share (%)."""
    own: dict[str, int] = {}
    incl: dict[str, int] = {}
    total = 0
    for line in collapsed.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_frame_key(f) for f in stack.split(";") if f]
        total += count
        if frames:
            own[frames[-1]] = own.get(frames[-1], 0) + count
        for frame in set(frames):
            incl[frame] = incl.get(frame, 0) + count

    def top(counts: dict[str, int]) -> list[tuple[str, float]]:
        ranked = sorted(counts.items(), key=lambda kv: kv[1], reverse=True)[:n]
        return [(name, 100.0 * c / total) for name, c in ranked]

    return {"self": top(own), "inclusive": top(incl), "samples": [("total", float(total))]}


def _py_spy() -> str | None:
    local = Path(sys.executable).parent / "py-spy"
    return str(local) if local.exists() else shutil.which("py-spy")


def profile_gateway(env: Env, target: Target, lua: Path) -> dict[str, Any] | None:
    """Sample the gateway with py-spy while wrk drives it at concurrency 64; returns the top frames."""
    spy = _py_spy()
    if spy is None:
        print("profile skipped: py-spy not found (`pip install py-spy`)")
        return None
    out = env.tmp / "profile.txt"
    secs = env.args.profile_seconds
    cmd = [spy, "record", "--format", "raw", "--nonblocking", "-r", "200", "-d", str(secs),
           "-p", str(target.pid), "-o", str(out)]
    spy_proc = env.procs.start("py-spy", cmd)
    time.sleep(1.0)
    run_wrk(target.url, lua, 64, secs, env.args.wrk_threads, env.args.wrk_timeout)
    try:
        spy_proc.wait(timeout=secs + 30)
    finally:
        env.procs.stop("py-spy")
    if not out.exists():
        print(f"profile failed:\n{env.procs.log_tail('py-spy')}")
        return None
    svg = RESULTS_DIR / f"profile-{target.name}-{time.strftime('%Y%m%d-%H%M%S')}.txt"
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(out, svg)
    return {"target": target.name, "collapsed_stacks": str(svg), **top_frames(out.read_text())}


# -------------------------------------------------------------------------------------- streaming phase


async def _engine_url(env: Env, stack: contextlib.AsyncExitStack) -> str:
    """The engine to stream from: `--engine-url`, or one replica of the demo micro model started here."""
    args = env.args
    if args.engine_url:
        return str(args.engine_url).rstrip("/")
    from backends.supervisor import EngineSupervisor
    from policies.schema import EngineSpec

    spec = EngineSpec(model="demo:micro", served_name=args.engine_model, max_model_len=1024, dtype="bfloat16",
                      kv_cache_space_gib=1, base_port=free_port(), startup_timeout_s=args.engine_timeout,
                      extra_args=("--enforce-eager",) if args.engine_eager else ())
    sup = EngineSupervisor("bench-micro", spec, progress=lambda m: print(f"  engine: {m}", flush=True))
    stack.push_async_callback(sup.aclose)
    print("starting a vLLM engine with the demo micro model (1-2 minutes)...", flush=True)
    await sup.start()
    return sup.urls[0]


async def _stream_cell(name: str, url: str, env: Env, rnd: int) -> dict[str, Any]:
    from loadtest.stream_client import run_closed_loop

    args = env.args
    load_before = os.getloadavg()[0]
    res = await run_closed_loop(url, args.engine_model, args.stream_concurrency, args.stream_duration,
                                args.stream_max_tokens)
    cell = {"round": rnd, "target": name, **res.to_json(), "loadavg_1m": [load_before, os.getloadavg()[0]]}
    errs = f"  ERRORS {res.errors}: {res.error_examples[:1]}" if res.errors else ""
    print(f"  round {rnd} {name:<8} {res.tokens_per_s:8.1f} tok/s  {res.requests:4d} req  "
          f"TTFT p50 {res.ttft_p50_ms or 0:7.1f} ms  p99 {res.ttft_p99_ms or 0:7.1f} ms{errs}", flush=True)
    return cell


async def stream_phase(env: Env) -> dict[str, Any]:
    """Closed-loop streaming at `--stream-concurrency`, engine direct vs through the gateway, interleaved."""
    from loadtest.stream_client import run_closed_loop

    args = env.args
    async with contextlib.AsyncExitStack() as stack:
        engine = await _engine_url(env, stack)
        gateway, _ = await asyncio.to_thread(start_gateway, env, "gateway-stream", engine, args.engine_model,
                                             args.stream_transport)
        targets = [("direct", engine), ("gateway", gateway)]
        for _, url in targets:  # warm-up: not recorded
            res = await run_closed_loop(url, args.engine_model, args.stream_concurrency, args.warmup, 8)
            if res.errors or not res.requests:
                raise RuntimeError(f"streaming warm-up against {url} failed: {res.error_examples}")
        cells: list[dict[str, Any]] = []
        for rnd in range(1, args.stream_rounds + 1):
            for name, url in targets if rnd % 2 else targets[::-1]:
                cells.append(await _stream_cell(name, url, env, rnd))
        env.procs.stop("gateway-stream")
    return {"engine_url": engine, "cells": cells, "summary": summarise_stream(cells)}


def summarise_stream(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over rounds; `ratio` = median of per-round gateway/direct tokens/s; `pooled_ratio` = sums."""
    by = {name: {c["round"]: c for c in cells if c["target"] == name} for name in ("direct", "gateway")}
    rounds = sorted(set(by["direct"]) & set(by["gateway"]))
    ratios = [by["gateway"][r]["tokens_per_s"] / by["direct"][r]["tokens_per_s"]
              for r in rounds if by["direct"][r]["tokens_per_s"] > 0]

    def pooled(name: str) -> float:
        wall = sum(c["wall_s"] for c in by[name].values())
        return sum(c["tokens"] for c in by[name].values()) / wall if wall else 0.0

    out: dict[str, Any] = {"rounds": len(rounds), "ratio": _median(ratios), "ratios": ratios}
    out["pooled_ratio"] = pooled("gateway") / pooled("direct") if pooled("direct") else None
    for name, cs in by.items():
        vals = list(cs.values())
        out[name] = {"tokens_per_s": _median([c["tokens_per_s"] for c in vals]),
                     "tokens_per_s_all": [c["tokens_per_s"] for c in vals],
                     "ttft_p50_ms": _median([c["ttft_p50_ms"] for c in vals]),
                     "ttft_p99_ms": _median([c["ttft_p99_ms"] for c in vals]),
                     "errors": sum(c["errors"] for c in vals)}
    return out


# ------------------------------------------------------------------------------------------- report


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def _verdict(name: str, value: float | None, op: str, limit: float, unit: str = "") -> dict[str, Any]:
    ok = value is not None and (value >= limit if op == ">=" else value < limit)
    return {"target": name, "value": value, "op": op, "limit": limit, "unit": unit, "pass": ok}


def verdicts(nonstream: dict[str, Any] | None, stream: dict[str, Any] | None, gateway: str) -> list[dict[str, Any]]:
    """PASS/FAIL per issue-2 target, for the gateway with the default transport (`gateway`)."""
    out = []
    if nonstream:
        rows = {(r["target"], r["concurrency"]): r for r in nonstream["summary"]}
        for conc in (16, 64):
            if (gateway, conc) in rows:
                out.append(_verdict(f"{gateway} req/s at c={conc} (10x LiteLLM)", rows[gateway, conc]["rps"],
                                    ">=", TARGET_RPS, "req/s"))
        if (gateway, 1) in rows:
            out.append(_verdict(f"{gateway} added p50 at c=1", rows[gateway, 1]["added_p50_ms"], "<",
                                TARGET_ADDED_P50_MS, "ms"))
        errors = sum(r["errors"] for r in nonstream["summary"] if r["target"] != "direct")
        out.append(_verdict("non-streaming errors through gateways", float(errors), "<", 0.5, "responses"))
    if stream:
        s = stream["summary"]
        out.append(_verdict("streaming tokens/s gateway/direct", s["ratio"], ">=", TARGET_STREAM_RATIO, "x"))
        out.append(_verdict("streaming errors", float(s["direct"]["errors"] + s["gateway"]["errors"]), "<", 0.5))
    return out


def print_nonstream(result: dict[str, Any], args: argparse.Namespace) -> None:
    print(f"\nNon-streaming, wrk -t{args.wrk_threads}, medians of {args.rounds} rounds x {args.duration:g} s; "
          "+p50/+p99 = gateway minus direct, paired per round; t/o = slower than --wrk-timeout")
    print(f"{'c':>3}  {'target':<11} {'req/s':>8} {'xLiteLLM':>8} {'p50 ms':>7} {'p99 ms':>7} {'+p50 ms':>8} "
          f"{'+p99 ms':>8} {'cpu ms/req':>10} {'errors':>6} {'t/o':>4}  req/s per round")
    for r in result["summary"]:
        per_round = " ".join(f"{v:.0f}" for v in r["rps_all"])
        print(f"{r['concurrency']:>3}  {r['target']:<11} {_fmt(r['rps'], '.0f'):>8} "
              f"{_fmt(r.get('x_litellm'), '.1f'):>8} {_fmt(r['p50_ms']):>7} {_fmt(r['p99_ms']):>7} "
              f"{_fmt(r['added_p50_ms']):>8} {_fmt(r['added_p99_ms']):>8} {_fmt(r['cpu_ms_per_req']):>10} "
              f"{r['errors']:>6} {r['timeouts']:>4}  {per_round}")


def print_stream(result: dict[str, Any], args: argparse.Namespace) -> None:
    s = result["summary"]
    print(f"\nStreaming, c={args.stream_concurrency}, max_tokens={args.stream_max_tokens} (ignore_eos), "
          f"medians of {s['rounds']} rounds x {args.stream_duration:g} s, engine {result['engine_url']}")
    print(f"{'target':<9} {'tok/s':>8} {'TTFT p50':>9} {'TTFT p99':>9} {'errors':>6}  tok/s per round")
    for name in ("direct", "gateway"):
        row = s[name]
        per_round = " ".join(f"{v:.0f}" for v in row["tokens_per_s_all"])
        print(f"{name:<9} {_fmt(row['tokens_per_s'], '.1f'):>8} {_fmt(row['ttft_p50_ms'], '.1f'):>9} "
              f"{_fmt(row['ttft_p99_ms'], '.1f'):>9} {row['errors']:>6}  {per_round}")
    ratios = " ".join(f"{r:.3f}" for r in s["ratios"])
    print(f"gateway/direct: median {_fmt(s['ratio'], '.3f')}, pooled {_fmt(s['pooled_ratio'], '.3f')}; "
          f"per round {ratios}")


def print_report(results: dict[str, Any], args: argparse.Namespace) -> None:
    if results.get("nonstream"):
        print_nonstream(results["nonstream"], args)
        prof = results["nonstream"].get("profile")
        if prof:
            print(f"\nProfile of {prof['target']} at c=64 (py-spy, % of samples; stacks in {prof['collapsed_stacks']})")
            for kind in ("self", "inclusive"):
                print(f"  top by {kind}:")
                for frame, pct in prof[kind]:
                    print(f"    {pct:5.1f}%  {frame}")
    if results.get("stream"):
        print_stream(results["stream"], args)
    print("\nTargets (issue 2):")
    for v in results["verdicts"]:
        print(f"  {'PASS' if v['pass'] else 'FAIL'}  {v['target']}: {_fmt(v['value'])} {v['unit']} "
              f"(target {v['op']} {v['limit']:g})")


# ---------------------------------------------------------------------------------------------- main


def _csv_ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _csv_words(text: str) -> list[str]:
    words = [x.strip() for x in text.split(",") if x.strip()]
    bad = [w for w in words if w not in ("aiohttp", "httpx")]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown transport(s) {bad}; use aiohttp and/or httpx")
    return words


def _add_nonstream_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("non-streaming overhead (wrk against the zero-latency fake upstream)")
    g.add_argument("--concurrency", type=_csv_ints, default=[1, 16, 64], help="wrk connections (default 1,16,64)")
    g.add_argument("--duration", type=float, default=5.0, help="seconds per wrk cell (default 5)")
    g.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    g.add_argument("--warmup", type=float, default=2.0, help="warm-up seconds per target, not recorded (default 2)")
    g.add_argument("--wrk-threads", type=int, default=1, help="wrk threads, capped at connections (default 1)")
    g.add_argument("--wrk-timeout", type=float, default=10.0,
                   help="wrk per-request timeout in s; slower requests count as t/o, not in p99 (default 10)")
    g.add_argument("--max-tokens", type=int, default=16, help="max_tokens of the request body (default 16)")
    g.add_argument("--transports", type=_csv_words, default=["aiohttp", "httpx"],
                   help="gateways to measure, one per upstream transport (default aiohttp,httpx; the first is "
                   "judged against the targets)")
    g.add_argument("--profile", action="store_true", help="also sample the first gateway with py-spy at c=64")
    g.add_argument("--profile-seconds", type=int, default=10, help="py-spy sampling time (default 10)")


def _add_stream_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("streaming tokens/s (real vLLM engine with the demo micro model)")
    g.add_argument("--engine-url", help="use this running engine instead of starting one (base URL, no /v1)")
    g.add_argument("--engine-model", default="micro", help="model name the engine serves (default micro)")
    g.add_argument("--engine-timeout", type=float, default=600, help="engine start-up limit in s (default 600)")
    g.add_argument("--no-engine-eager", dest="engine_eager", action="store_false",
                   help="let vLLM compile (slower start); by default the started engine runs --enforce-eager")
    g.add_argument("--stream-concurrency", type=int, default=16, help="closed-loop streams (default 16)")
    g.add_argument("--stream-duration", type=float, default=15.0, help="seconds per streaming cell (default 15)")
    g.add_argument("--stream-rounds", type=int, default=3, help="interleaved rounds (default 3)")
    g.add_argument("--stream-max-tokens", type=int, default=64, help="tokens per answer (default 64)")
    g.add_argument("--stream-transport", choices=["aiohttp", "httpx"], default="aiohttp",
                   help="gateway transport for the streaming phase (default aiohttp)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m loadtest.overhead_bench", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Needs wrk (apt-get install -y wrk), Redis on --redis-url, and for --profile py-spy "
        "(pip install py-spy). Every process started here is stopped at the end, also on Ctrl-C.",
    )
    p.add_argument("--skip-nonstream", action="store_true", help="skip the wrk part")
    p.add_argument("--skip-stream", action="store_true", help="skip the streaming part (no engine needed)")
    p.add_argument("--redis-url", default=os.environ.get("CASCADE_REDIS_URL", "redis://127.0.0.1:6379/0"),
                   help="Redis of the ledger; keys go under bench:<uuid>: and are deleted at the end")
    p.add_argument("--ready-timeout", type=float, default=60, help="seconds to wait for a gateway/upstream")
    p.add_argument("--ledger", choices=["redis", "memory"], default="redis",
                   help="gateway --ledger (default redis, as in production; memory shows the ledger's cost)")
    p.add_argument("--gateway-cmd", help="command taking `serve ...` arguments instead of `python -m gateway`, "
                   "e.g. 'python /tmp/patched.py' for an A/B run of a proposed change")
    p.add_argument("--gateway-log-level", default="WARNING", help="gateway --log-level (default WARNING)")
    p.add_argument("--out", type=Path, help="JSON path (default loadtest/results/overhead-<timestamp>.json)")
    p.add_argument("--keep-logs", action="store_true", help="keep the temp dir with process logs and policies")
    _add_nonstream_args(p)
    _add_stream_args(p)
    return p


def _meta(env: Env) -> dict[str, Any]:
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False)
    return {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cpus": os.cpu_count(), "loadavg": os.getloadavg(),
            "git": rev.stdout.strip(), "python": sys.version.split()[0], "redis_prefix": env.prefix,
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(env.args).items()},
            "targets": {"rps": TARGET_RPS, "added_p50_ms": TARGET_ADDED_P50_MS, "stream_ratio": TARGET_STREAM_RATIO,
                        "litellm_rps": LITELLM_RPS}}


def run(env: Env) -> dict[str, Any]:
    """Both phases; returns the results document (without writing it)."""
    results: dict[str, Any] = {"meta": _meta(env)}
    if not env.args.skip_nonstream:
        print("== non-streaming overhead ==", flush=True)
        results["nonstream"] = nonstream_phase(env)
        env.procs.stop_all()
    if not env.args.skip_stream:
        print("== streaming tokens/s ==", flush=True)
        results["stream"] = asyncio.run(stream_phase(env))
    results["meta"]["gateway_launcher"] = env.launcher
    results["meta"]["loadavg_end"] = os.getloadavg()
    gateway = f"gw-{env.args.transports[0]}" if env.args.transports else "gw-aiohttp"
    results["verdicts"] = verdicts(results.get("nonstream"), results.get("stream"), gateway)
    return results


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _write(results: dict[str, Any], out: Path | None) -> Path:
    path = out or RESULTS_DIR / f"overhead-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2, default=str) + "\n")
    return path


def _finish(env: Env, ok: bool) -> None:
    env.procs.stop_all()
    try:
        print(f"deleted {cleanup_redis(env.args.redis_url, env.prefix)} Redis keys under {env.prefix}")
    except Exception as exc:
        print(f"warning: could not clean Redis keys under {env.prefix}: {exc}", file=sys.stderr)
    if env.args.keep_logs or not ok:
        print(f"logs and policies kept in {env.tmp}")
    else:
        shutil.rmtree(env.tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.skip_nonstream and shutil.which("wrk") is None:
        print(WRK_INSTALL_HINT, file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _interrupt)
    env = Env(args, Path(tempfile.mkdtemp(prefix="overhead-bench-")), Procs(Path()), f"bench:{uuid.uuid4().hex}:")
    env.procs = Procs(env.tmp)
    ok = False
    try:
        results = run(env)
        ok = True
    except KeyboardInterrupt:
        print("interrupted; stopping everything started here", file=sys.stderr)
        return 130
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        return 2
    finally:
        _finish(env, ok)
    print_report(results, args)
    print(f"\nresults written to {_write(results, args.out)}")
    return 0 if all(v["pass"] for v in results["verdicts"]) else 1


if __name__ == "__main__":
    sys.exit(main())
