"""Faults in turn and overlapping, under steady load from `loadtest.load.generator`: the gateway (`cascade serve`, its
supervisor running one real demo vLLM engine as the micro pool) keeps its promises while

- the remote pool `cloud` (optional for readiness) becomes unreachable: its fake server is dropped, so its port is
  closed, and it stays down to the end;
- the micro engine hangs: its process group is SIGSTOPped, so it is alive but answers nothing, and the policy's
  `hang_restart_after_s` must make the supervisor kill and restart it (requests fail over to `flagship`, a fake
  engine, meanwhile);
- Redis (a private redis-server, never the shared one) is killed and started again on the same port, with one
  tenant `on_redis_outage: fail_closed` (`strict`) and one `fail_open` (`lenient`), both rate limited;
- with `--kill-after-back-s`, the restarted micro engine is SIGKILLed (its whole process group) that long after it
  is back, once the gateway has a request in flight on it (the answers of that stretch of load are longer, so that
  one is still being made when the kill lands): requests in flight fail over to `flagship` or fail cleanly (an
  OpenAI error, in the stream if it had started), the supervisor restarts it again, its new engine core placed
  beside its worker, and none of the killed group's processes is left.

The load lasts at least `load_s` and then until the restarted engine has been back for 10 s (after the kill, if
any; an engine start is 1-2 minutes on 2 shared cores). It prints what the client saw (requests sent, answered
per status), the 5xx other than the fail_closed 503s, the ledger against the completed requests (after Redis is
back and the gateway's outbox has replayed what it held), the engine restarts the gateway counts
(`cascade_engine_restarts_total{reason}`) and `/readyz` over time with the reason of each 503 (Redis down, a
required pool down, or neither: a fault of the gateway). `loadtest.scenarios.chaos_figures` computes these figures
and turns the record into pass/fail lines. Run `python -m loadtest.scenarios chaos --help`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from backends.engines.cpu_pinning import cpus_of, engine_processes, thread_affinity
from backends.engines.supervisor import live_group_members
from backends.models.demo import models_root
from loadtest.fake_upstream import FakeUpstream
from loadtest.load.client import Sample
from loadtest.load.connections import connector
from loadtest.load.generator import LoadConfig, LoadRun, TenantKey, run_load
from loadtest.load.phases import Phase
from loadtest.load.prompt_mix import parse_mix
from loadtest.private_redis import PrivateRedis
from loadtest.processes import Procs, free_port
from loadtest.scenarios.chaos_figures import (
    PREFIX,
    check_invariants,
    client_view,
    compare_ledger,
    engine_restarts,
    format_record,
    micro_in_flight,
    readiness,
    state,
    supervisor_lines,
)
from loadtest.scenarios.checks import format_checks
from loadtest.scenarios.fake_engines import InProcessServer, start_gateway

__all__ = ["Faults", "add_chaos_arguments", "chaos_policy", "chaos_scenario", "engine_pid", "faults_of", "run_chaos"]

STRICT_KEY, LENIENT_KEY = "sk-chaos-strict", "sk-chaos-lenient"
CHUNK_S = 10.0  # the load is sent in loadgen runs of this length, so that it can end once the engine is back
TAIL_S = 10.0  # seconds of load after /readyz says the micro pool is back
KILL_WAIT_S = 10.0  # the kill waits this long at most for a request in flight on the engine
KILL_MAX_TOKENS = 128  # the answers asked for in the chunk the kill falls in (at least `--max-tokens`): a short
# answer found in flight had often ended before the kill landed (24 tokens: once in a run beside other engine tests)
KILLED = "micro engine SIGKILLed (process group)"  # the kill's event (Redis is SIGKILLed too: its own words)


@dataclass(frozen=True, slots=True)
class Faults:
    """When each fault starts, in seconds from the start of the load, and how long the load lasts: at least
    `load_s`, then until the restarted micro engine has served `TAIL_S`, at most `max_load_s`."""

    load_s: float = 60.0
    max_load_s: float = 240.0
    cloud_down_s: float = 8.0
    hang_s: float = 15.0
    redis_down_s: float = 35.0
    redis_up_s: float = 50.0
    hang_restart_after_s: float = 8.0
    kill_after_back_s: float | None = None  # SIGKILL the engine this long after its restart is back; None: no kill


def _sha(key: str) -> str:
    import hashlib

    return hashlib.sha256(key.encode()).hexdigest()


def chaos_policy(engine_port: int, flagship_url: str, cloud_url: str, hang_restart_after_s: float) -> str:
    """micro: one local demo engine (required for readiness, the default of a local pool); flagship and cloud:
    remote fake engines, cloud optional for readiness (the default of a remote pool); failover on."""
    engine = (f"model: demo:micro, served_name: micro, replicas: 1, max_model_len: 1024, dtype: bfloat16, "
              f"kv_cache_space_gib: 1, base_port: {engine_port}, startup_timeout_s: 600, "
              f'hang_restart_after_s: {hang_restart_after_s:g}, extra_args: ["--enforce-eager"]')
    limits = "rate_limits: {requests_per_minute: 100000}"
    return f"""version: 1
pools:
  micro:
    type: local
    price: {{input_per_mtok: "0.20", output_per_mtok: "0.20"}}
    engine: {{{engine}}}
  flagship:
    type: remote
    urls: ["{flagship_url}"]
    model: flagship-model
    price: {{input_per_mtok: "3.00", output_per_mtok: "15.00"}}
  cloud:
    type: remote
    urls: ["{cloud_url}"]
    model: cloud-model
    price: {{input_per_mtok: "5.00", output_per_mtok: "20.00"}}
routing:
  micro_pool: micro
  flagship_pool: flagship
  threshold: 0.5
  failover: true
tenants:
  strict: {{api_key_sha256: ['{_sha(STRICT_KEY)}'], on_redis_outage: fail_closed, {limits}}}
  lenient: {{api_key_sha256: ['{_sha(LENIENT_KEY)}'], on_redis_outage: fail_open, {limits}}}
"""


# ------------------------------------------------------------------------------------ the engine's process

def _children(pid: int) -> list[int]:
    """PIDs whose parent is `pid` (Linux /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry.name))
    return out


def engine_pid(gateway_pid: int) -> int:
    """The vLLM API server the gateway's supervisor started (a child of the gateway, leader of its own group)."""
    for child in _children(gateway_pid):
        with contextlib.suppress(OSError):
            if b"vllm" in Path(f"/proc/{child}/cmdline").read_bytes() and os.getpgid(child) == child:
                return child
    raise RuntimeError(f"no vLLM engine process under the gateway (pid {gateway_pid})")


def _end_group(pgid: int) -> None:
    """A stopped group left behind (the restart failed, or the run ended early): continue it and kill it. Only
    while its leader is still there and stopped (state T), so that a reused PID is never signalled."""
    try:
        stopped = Path(f"/proc/{pgid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except (OSError, IndexError):
        return
    if not stopped:
        return
    for sig in (signal.SIGCONT, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)


# --------------------------------------------------------------------------------------------- the run

@dataclass
class _Env:
    procs: Procs
    redis: PrivateRedis
    cloud: InProcessServer
    url: str
    gateway_pid: int
    events: list[tuple[float, str]]
    hung: list[int]
    killed: list[int]
    answering: Counter[str] = field(default_factory=Counter)  # the load's streams being answered now, per pool


async def _poll_readyz(url: str, t0: float, stop: asyncio.Event, out: list[dict[str, Any]]) -> None:
    async with aiohttp.ClientSession(connector=connector(100), timeout=aiohttp.ClientTimeout(total=5)) as session:
        while not stop.is_set():
            at = round(time.monotonic() - t0, 1)
            try:
                async with session.get(url + "/readyz") as resp:
                    body = orjson.loads(await resp.read())
                    out.append({"t": at, "status": resp.status, "redis": body.get("redis"),
                                "pools": body.get("pools", {}), "required": body.get("required", []),
                                "degraded": body.get("degraded", [])})
            except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError) as exc:
                out.append({"t": at, "status": 0, "error": f"{type(exc).__name__}: {exc}"})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)


def _hooks(env: _Env, faults: Faults) -> list[tuple[float, str, Callable[[], None]]]:
    def hang() -> None:
        pid = engine_pid(env.gateway_pid)
        env.hung.append(pid)
        os.killpg(pid, signal.SIGSTOP)

    return [(faults.cloud_down_s, "cloud pool unreachable (its server dropped, port closed)", env.cloud.kill),
            (faults.hang_s, "micro engine SIGSTOPped (process group)", hang),
            (faults.redis_down_s, "Redis killed (SIGKILL)", env.redis.kill),
            (faults.redis_up_s, "Redis started again (same port, same data)", env.redis.start)]


async def _fire(hooks: list[tuple[float, str, Callable[[], None]]], t0: float, events: list[tuple[float, str]]) -> None:
    for at, what, action in hooks:
        await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
        await asyncio.to_thread(action)  # a Redis start or a server drop blocks for a moment: not on the loop
        _event(events, t0, what)


def _event(events: list[tuple[float, str]], t0: float, what: str) -> float:
    """Record and print that `what` happened now; when, from `t0`, to the millisecond (a kill's requests in flight
    are those sent before it and ended after it)."""
    events.append((round(time.monotonic() - t0, 3), what))
    print(f"  [{events[-1][0]:6.1f}s] {what}", flush=True)
    return events[-1][0]


def _chunk(env: _Env, args: argparse.Namespace, k: int, kill: bool = False) -> LoadConfig:
    """The `k`th chunk of the load; `kill`: the one the engine is killed in, whose answers are longer
    (`KILL_MAX_TOKENS`), so that the request the kill waits for is still being answered when it lands."""
    max_tokens = max(args.max_tokens, KILL_MAX_TOKENS) if kill else args.max_tokens
    return LoadConfig(base_url=env.url, model="auto", phases=[Phase("chaos", CHUNK_S, args.rate, args.rate)],
                      mix=parse_mix(args.mix), tenants=[TenantKey("strict", STRICT_KEY), TenantKey("lenient",
                      LENIENT_KEY)], max_tokens=max_tokens, seed=args.seed + k, timeout_s=90, progress=False,
                      label="chaos", answering=env.answering)


def _micro_back_at(ready: list[dict[str, Any]], after: float = 0.0) -> float | None:
    """When /readyz first said the micro pool is up again after it had said it is down (both from `after` on)."""
    was_down = False
    for p in ready:
        if p["t"] < after:
            continue
        up = p.get("pools", {}).get("micro")
        was_down = was_down or up is False
        if was_down and up:
            return float(p["t"])
    return None


def _kill(env: _Env, t0: float) -> float:
    """SIGKILL the micro engine's whole process group (API server, engine core, worker) once a stream of the load
    is being answered by it (waiting up to `KILL_WAIT_S`), so that the kill cuts requests; when, from `t0`. The
    client's own count, not the gateway's in-flight gauge: that one also counts the gateway's own calls (a cascade's
    probe, a shadow comparison) and a stream whose client has had its [DONE] (it falls when the relay closes)."""
    pid = engine_pid(env.gateway_pid)
    deadline = time.monotonic() + KILL_WAIT_S
    while not (found := env.answering["micro"] >= 1) and time.monotonic() < deadline:
        time.sleep(0.02)
    streams = env.answering["micro"]
    env.killed.append(pid)
    os.killpg(pid, signal.SIGKILL)  # at once: reading the gateway's gauge first would give the streams time to end
    killed = _event(env.events, t0, KILLED)
    if not found:
        _event(env.events, t0, f"no stream of the load answered by micro for {KILL_WAIT_S:g} s")
    else:
        _event(env.events, t0, f"{streams} stream(s) answered by micro at the kill; the gateway's gauge, read just "
                               f"after, says {micro_in_flight(env.url):g} in flight there")
    return killed


def placement(api_pid: int) -> dict[str, Any]:
    """Where the engine's processes may run: its engine core beside its worker (the supervisor's placement), or
    unbound where the worker is (another engine's worker on the same cores leaves both unbound)."""
    procs = engine_processes(api_pid)
    workers = cpus_of(procs.workers)
    core = thread_affinity(procs.engine_cores[0]) if len(procs.engine_cores) == 1 else frozenset()
    everything = frozenset(os.sched_getaffinity(0))
    return {"engine_cores": len(procs.engine_cores), "workers": len(procs.workers), "worker_cpus": sorted(workers),
            "engine_core_cpus": sorted(core), "placed": bool(procs.workers) and core in (workers, everything)}


async def _load(env: _Env, faults: Faults, args: argparse.Namespace) -> tuple[list[Sample], list[dict[str, Any]]]:
    """Poisson arrivals at `args.rate` in back-to-back chunks of `CHUNK_S` (each a `load.generator` run, started on
    time while the one before still finishes its requests), for at least `load_s` and until the micro pool has
    been back `TAIL_S` (after the kill, where there is one; at most `max_load_s`)."""
    t0, stop = time.monotonic(), asyncio.Event()
    killed_at: float | None = None
    ready: list[dict[str, Any]] = []
    poller = asyncio.create_task(_poll_readyz(env.url, t0, stop, ready))
    fire = asyncio.create_task(_fire(_hooks(env, faults), t0, env.events))
    chunks: list[asyncio.Task[LoadRun]] = []
    try:
        while True:
            at, back = time.monotonic() - t0, _micro_back_at(ready, killed_at or 0.0)
            kill = faults.kill_after_back_s is not None and killed_at is None and back is not None \
                and at - back >= faults.kill_after_back_s
            if at >= faults.max_load_s or (not kill and at >= faults.load_s and back is not None
                                           and at - back >= TAIL_S):
                break
            chunks.append(asyncio.create_task(run_load(_chunk(env, args, len(chunks), kill))))
            if kill:  # after the next chunk has started: the kill waits for one of its requests on the engine
                killed_at, back = await asyncio.to_thread(_kill, env, t0), None
            if not args.quiet and ready:
                print(f"  [{at:6.1f}s] /readyz {state(ready[-1])}", flush=True)
            await asyncio.sleep(max(0.0, t0 + CHUNK_S * len(chunks) - time.monotonic()))
        runs = [await task for task in chunks]
    finally:
        stop.set()
        await poller
        for task in (fire, *chunks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    samples = []
    for run in runs:
        for sample in run.samples:
            sample.sent_s += run.t0 - t0  # on the events' clock, to the millisecond (the kill cuts requests)
            samples.append(sample)
    return samples, ready


def _start(stack: ExitStack, procs: Procs, tmp: Path, faults: Faults, args: argparse.Namespace) -> _Env:
    redis_dir = tmp / "redis"
    redis_dir.mkdir()
    private = PrivateRedis(redis_dir)
    stack.callback(private.kill)
    private.start()
    flagship = stack.enter_context(InProcessServer(FakeUpstream("flagship-model", delay_ms=args.fake_delay_ms)))
    cloud = stack.enter_context(InProcessServer(FakeUpstream("cloud-model", delay_ms=args.fake_delay_ms)))
    home = tmp / "home"
    home.mkdir()
    (home / "models").symlink_to(models_root(), target_is_directory=True)  # the demo models, built once
    policy = tmp / "policy.yaml"
    policy.write_text(chaos_policy(free_port(), flagship.url, cloud.url, faults.hang_restart_after_s))
    print(f"starting the gateway and its micro engine (policy {policy}); about a minute", flush=True)
    started = time.monotonic()
    url = start_gateway(procs, policy, home, engines=True, scorer="none", redis_prefix=PREFIX,
                        ready_timeout_s=args.ready_timeout, env={"CASCADE_REDIS_URL": private.url}, log_level="INFO")
    print(f"gateway ready in {time.monotonic() - started:.0f} s at {url}", flush=True)
    return _Env(procs, private, cloud, url, procs.pid("gateway"), [], [], [])


def _keep_logs(tmp: Path, out: Path) -> Path:
    """Copy the gateway's and the engine's logs out of the run's temporary folder; returns where they went."""
    import shutil

    dest = out / f"chaos-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}"
    dest.mkdir(parents=True, exist_ok=True)
    for path in [tmp / "gateway.log", *sorted((tmp / "home" / "logs").glob("*.log"))]:
        if path.exists():
            shutil.copy(path, dest / path.name)
    return dest


def run_chaos(args: argparse.Namespace, faults: Faults) -> dict[str, Any]:
    """One run (gateway start, load with the faults, ledger settle); returns its record."""
    with tempfile.TemporaryDirectory(prefix="scenario-chaos-") as tmp, ExitStack() as stack:
        procs = Procs(Path(tmp))
        env: _Env | None = None
        try:
            env = _start(stack, procs, Path(tmp), faults, args)
            loadavg = os.getloadavg()
            samples, ready = asyncio.run(_load(env, faults, args))
            completed = {str(s.request_id): s for s in samples if s.ok}
            ledger = asyncio.run(compare_ledger(env.redis.url, completed, args.settle_s))
            restarts = engine_restarts(env.url)
            new_pid = engine_pid(env.gateway_pid)
            placed = placement(new_pid)
            killed_left = {pid: live_group_members(pid) for pid in env.killed}
        except BaseException:
            if env is None:
                print(procs.log_tail("gateway"))
            raise
        finally:
            procs.stop_all()
            for pid in env.hung if env else []:
                _end_group(pid)
            logs = _keep_logs(Path(tmp), args.out)
        (logs / "samples.json").write_bytes(orjson.dumps([s.to_json() for s in samples]))
    return {"logs": str(logs), "supervisor": supervisor_lines(logs / "gateway.log"), "faults": _fields(faults),
            "loadavg_at_start": [round(x, 2) for x in loadavg],
            "loadavg_at_end": [round(x, 2) for x in os.getloadavg()], "events": env.events,
            "client": client_view(samples, faults.hang_s, _kill_window(env.events, ready)), "ledger": ledger,
            "restarts": restarts, "engine_pid": {"hung": env.hung, "killed": env.killed, "after": new_pid},
            "killed_group_left": killed_left, "placement": placed, "readyz": readiness(ready)}


def _kill_window(events: list[tuple[float, str]], ready: list[dict[str, Any]]) -> tuple[float, float] | None:
    """From the kill to when /readyz said the micro pool was back; None without a kill (or if it never came back,
    then to the end of the run)."""
    kill = next((t for t, what in events if what == KILLED), None)
    if kill is None:
        return None
    back = _micro_back_at(ready, kill)
    return kill, back if back is not None else float("inf")


def _fields(faults: Faults) -> dict[str, float]:
    return {name: getattr(faults, name) for name in Faults.__slots__}


def add_chaos_arguments(p: argparse.ArgumentParser) -> None:
    d = Faults()
    for name in Faults.__slots__:
        p.add_argument(f"--{name.replace('_', '-')}", type=float, default=getattr(d, name),
                       help="seconds (default %(default)s)")
    p.add_argument("--settle-s", type=float, default=60.0, help="wait this long at most for the outbox replay")
    p.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for the engine")


def faults_of(args: argparse.Namespace) -> Faults:
    return Faults(**{name: getattr(args, name) for name in Faults.__slots__})


def chaos_scenario(args: argparse.Namespace) -> dict[str, Any]:
    """The `chaos` scenario of `loadtest.scenarios.cli`: one run, its figures and its checks printed."""
    print(f"\n=== chaos: {args.load_s:g}-{args.max_load_s:g} s at {args.rate:g} req/s, model auto, tenants strict "
          "(fail_closed) and lenient (fail_open)", flush=True)
    record = run_chaos(args, faults_of(args))
    print(format_record(record))
    checks = check_invariants(record)
    print(format_checks(checks))
    record["checks"] = [c.to_json() for c in checks]
    return record
