"""Faults in turn and overlapping, under steady load from `loadtest.loadgen`: the gateway (`cascade serve`, its
supervisor running one real demo vLLM engine as the micro pool) keeps its promises while

- the remote pool `cloud` (optional for readiness) becomes unreachable: its fake server is dropped, so its port is
  closed, and it stays down to the end;
- the micro engine hangs: its process group is SIGSTOPped, so it is alive but answers nothing, and the policy's
  `hang_restart_after_s` must make the supervisor kill and restart it (requests fail over to `flagship`, a fake
  engine, meanwhile);
- Redis (a private redis-server, never the shared one) is killed and started again on the same port, with one
  tenant `on_redis_outage: fail_closed` (`strict`) and one `fail_open` (`lenient`), both rate limited.

It prints what the client saw (requests sent, answered per status), the 5xx other than the fail_closed 503s, the
ledger against the completed requests (after Redis is back and the gateway's outbox has replayed what it held),
the engine restarts the gateway counts (`cascade_engine_restarts_total{reason}`) and `/readyz` over time with the
reason of each 503 (Redis down, a required pool down, or neither: a fault of the gateway). `check_invariants`
turns the record into pass/fail lines. Run `python -m loadtest.scenarios chaos --help`.
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
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import redis
import redis.asyncio as aioredis

from backends.demo_models import models_root
from gateway.costs.report import verify
from gateway.ledger.keys import LedgerKeys
from loadtest.bench_env import Procs, free_port, http_get
from loadtest.fake_upstream import FakeUpstream
from loadtest.load_client import Sample
from loadtest.load_metrics import samples as metric_samples
from loadtest.load_phases import Phase
from loadtest.loadgen import LoadConfig, TenantKey, run_load
from loadtest.prompt_mix import parse_mix
from loadtest.scenario_checks import Check, format_checks
from loadtest.scenario_env import InProcessServer, start_gateway
from tests.servers import PrivateRedis

__all__ = ["Faults", "add_chaos_arguments", "chaos_policy", "chaos_scenario", "check_invariants", "engine_pid",
           "faults_of", "format_record", "run_chaos"]

STRICT_KEY, LENIENT_KEY = "sk-chaos-strict", "sk-chaos-lenient"
PREFIX = "chaos:"  # the private Redis holds nothing else


@dataclass(frozen=True, slots=True)
class Faults:
    """When each fault starts, in seconds from the start of the load, and how long the load lasts."""

    load_s: float = 150.0
    cloud_down_s: float = 8.0
    hang_s: float = 15.0
    redis_down_s: float = 35.0
    redis_up_s: float = 50.0
    hang_restart_after_s: float = 8.0


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
    """A stopped group left behind (the restart failed, or the run ended early): continue it and kill it."""
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


async def _poll_readyz(url: str, t0: float, stop: asyncio.Event, out: list[dict[str, Any]]) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
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
        events.append((round(time.monotonic() - t0, 1), what))
        print(f"  [{events[-1][0]:6.1f}s] {what}", flush=True)


async def _load(env: _Env, faults: Faults, args: argparse.Namespace) -> tuple[list[Sample], list[dict[str, Any]]]:
    config = LoadConfig(base_url=env.url, model="auto", phases=[Phase("chaos", faults.load_s, args.rate, args.rate)],
                        mix=parse_mix(args.mix), tenants=[TenantKey("strict", STRICT_KEY), TenantKey("lenient",
                        LENIENT_KEY)], max_tokens=args.max_tokens, seed=args.seed, timeout_s=90,
                        progress=not args.quiet, label="chaos")
    t0, stop = time.monotonic(), asyncio.Event()
    ready: list[dict[str, Any]] = []
    poller = asyncio.create_task(_poll_readyz(env.url, t0, stop, ready))
    fire = asyncio.create_task(_fire(_hooks(env, faults), t0, env.events))
    try:
        run = await run_load(config)
    finally:
        stop.set()
        await poller
        if not fire.done():
            fire.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await fire
    return run.samples, ready


def _records(url: str) -> list[dict[str, str]]:
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        entries: list[tuple[str, dict[str, str]]] = client.xrange(PREFIX + "records")  # type: ignore[assignment]
        return [fields for _, fields in entries]
    finally:
        client.close()


async def _ledger(redis_url: str, completed: dict[str, Sample], settle_s: float) -> dict[str, Any]:
    """Wait (up to `settle_s`) for a record of every completed request (the outbox replays after an outage),
    then compare: records by status, completed without a record, recorded twice, tokens, rollups."""
    waited = time.monotonic()
    while True:
        records = await asyncio.to_thread(_records, redis_url)
        ok = {r["request_id"]: r for r in records if r["status"] == "ok"}
        if ok.keys() >= completed.keys() or time.monotonic() - waited > settle_s:
            break
        await asyncio.sleep(0.5)
    ids = Counter(r["request_id"] for r in records)
    wrong_tokens = [rid for rid, s in completed.items() if rid in ok and (int(ok[rid]["prompt_tokens"]),
                    int(ok[rid]["completion_tokens"])) != (s.prompt_tokens, s.completion_tokens)]
    client = aioredis.Redis.from_url(redis_url)
    try:
        today = datetime.now(UTC).date()
        rollups = await verify(client, LedgerKeys(PREFIX), today - timedelta(days=1), today)
    finally:
        await client.aclose()
    return {"records": len(records), "by_status": dict(Counter(r["status"] for r in records)),
            "completed": len(completed), "lost": sorted(completed.keys() - ok.keys()),
            "ok_not_completed": sorted(ok.keys() - completed.keys()),
            "twice": [i for i, n in ids.items() if n > 1], "wrong_tokens": wrong_tokens,
            "rollups_ok": rollups.ok, "settled_in_s": round(time.monotonic() - waited, 1)}


def _fail_closed(s: Sample) -> bool:
    return s.tenant == "strict" and s.status == 503 and "cannot be checked" in (s.error or "")


def _client_view(samples: list[Sample], faults: Faults) -> dict[str, Any]:
    def label(s: Sample) -> str:
        if s.ok:
            return "200"
        if _fail_closed(s):
            return "503 fail_closed"
        return "200 stream error" if s.status == 200 else "no answer" if s.status == 0 else str(s.status)

    answered = Counter(f"{s.tenant} {label(s)}" for s in samples)
    unexpected = [s for s in samples if s.status >= 500 and not _fail_closed(s)]
    pools = Counter(f"{s.pool or '-'}" for s in samples if s.ok)
    micro_after = [s for s in samples if s.ok and s.pool == "micro" and s.sent_s > faults.hang_s]
    return {"sent": len(samples), "answered": dict(sorted(answered.items())), "pools": dict(pools),
            "unexpected_5xx": len(unexpected), "unexpected_examples": [s.error for s in unexpected[:3]],
            "other_failures": [f"{s.status} {s.error}" for s in samples
                               if not s.ok and not _fail_closed(s) and s.status < 500][:5],
            "micro_served_after_hang": len(micro_after),
            "micro_back_at_s": round(min(s.sent_s for s in micro_after), 1) if micro_after else None}


def _readiness(ready: list[dict[str, Any]]) -> dict[str, Any]:
    """/readyz spans (state changes) and each 503's reason."""
    def state(p: dict[str, Any]) -> str:
        if p["status"] == 200:
            return "200" + (f" degraded {','.join(p['degraded'])}" if p["degraded"] else "")
        if p["status"] == 0:
            return "no answer"
        down = [n for n in p["required"] if not p["pools"].get(n, False)]
        why = (["redis down"] if p["redis"] is False else []) + [f"{n} down (required)" for n in down]
        return f"{p['status']} " + (", ".join(why) or "no reason (optional pools only)")

    spans: list[list[Any]] = []
    for p in ready:
        s = state(p)
        if spans and spans[-1][2] == s:
            spans[-1][1] = p["t"]
        else:
            spans.append([p["t"], p["t"], s])
    unexplained = [p for p in ready if (p["status"] != 200 and "no reason" in state(p)) or p["status"] == 0]
    cloud_seen_down = any("cloud" in p.get("degraded", []) for p in ready)
    return {"samples": len(ready), "spans": spans, "unexplained_503": len(unexplained),
            "cloud_reported_degraded": cloud_seen_down}


def _restarts(url: str) -> dict[str, float]:
    _, body = http_get(url + "/metrics", timeout_s=10)
    return {lb.get("reason", "?"): v for name, lb, v in metric_samples(body.decode())
            if name == "cascade_engine_restarts_total" and lb.get("pool") == "micro"}


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
    return _Env(procs, private, cloud, url, procs.pid("gateway"), [], [])


def _keep_logs(tmp: Path, out: Path) -> Path:
    """Copy the gateway's and the engine's logs out of the run's temporary folder; returns where they went."""
    import shutil

    dest = out / f"chaos-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}"
    dest.mkdir(parents=True, exist_ok=True)
    for path in [tmp / "gateway.log", *sorted((tmp / "home" / "logs").glob("*.log"))]:
        if path.exists():
            shutil.copy(path, dest / path.name)
    return dest


def _supervisor_lines(log: Path) -> list[str]:
    """What the supervisor said about the micro pool (starts, the hang, the restart and how long it took)."""
    if not log.exists():
        return []
    lines = []
    for line in log.read_text(errors="replace").splitlines():
        with contextlib.suppress(orjson.JSONDecodeError):
            message = orjson.loads(line).get("msg", "") if line.startswith("{") else line
            if "pool micro:" in message and "waiting for" not in message:
                lines.append(message[:200])
    return lines


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
            ledger = asyncio.run(_ledger(env.redis.url, completed, args.settle_s))
            restarts = _restarts(env.url)
            new_pid = engine_pid(env.gateway_pid)
        except BaseException:
            if env is None:
                print(procs.log_tail("gateway"))
            raise
        finally:
            procs.stop_all()
            for pid in env.hung if env else []:
                _end_group(pid)
            logs = _keep_logs(Path(tmp), args.out)
    return {"logs": str(logs), "supervisor": _supervisor_lines(logs / "gateway.log"), "faults": _fields(faults),
            "loadavg_at_start": [round(x, 2) for x in loadavg],
            "loadavg_at_end": [round(x, 2) for x in os.getloadavg()], "events": env.events,
            "client": _client_view(samples, faults), "ledger": ledger, "restarts": restarts,
            "engine_pid": {"hung": env.hung, "after": new_pid}, "readyz": _readiness(ready)}


def _fields(faults: Faults) -> dict[str, float]:
    return {name: getattr(faults, name) for name in Faults.__slots__}


def check_invariants(record: dict[str, Any]) -> list[Check]:
    client, ledger, ready = record["client"], record["ledger"], record["readyz"]
    hung = record["engine_pid"]["hung"]
    return [
        Check("no 5xx but the fail_closed 503s", client["unexpected_5xx"] == 0, str(client["unexpected_examples"])),
        Check("no lost cost record (every completed request recorded once, its tokens, rollups verified)",
              not ledger["lost"] and not ledger["twice"] and not ledger["wrong_tokens"] and ledger["rollups_ok"],
              f"{ledger['completed']} completed, {ledger['by_status']} records; lost {ledger['lost'][:3]}"),
        Check("the hung engine was restarted and counted", record["restarts"].get("hung", 0) >= 1
              and bool(hung) and record["engine_pid"]["after"] not in hung, f"restarts {record['restarts']}"),
        Check("the micro engine serves again after its restart", client["micro_served_after_hang"] > 0,
              f"first at {client['micro_back_at_s']} s"),
        Check("/readyz never failed because of the optional cloud pool", ready["unexplained_503"] == 0
              and ready["cloud_reported_degraded"], f"{len(ready['spans'])} spans"),
    ]


def format_record(record: dict[str, Any]) -> str:
    c, led, r = record["client"], record["ledger"], record["readyz"]
    lines = [f"load average at start {record['loadavg_at_start']}, at end {record['loadavg_at_end']}",
             "faults: " + "; ".join(f"{t} s {what}" for t, what in record["events"]),
             f"requests sent {c['sent']}; answered: " + ", ".join(f"{k} {v}" for k, v in c["answered"].items()),
             f"served by pool: {c['pools']}; micro again from {c['micro_back_at_s']} s "
             f"({c['micro_served_after_hang']} after the hang)",
             f"5xx other than fail_closed 503: {c['unexpected_5xx']} {c['unexpected_examples']}",
             f"other failures, e.g.: {c['other_failures']}",
             f"ledger: {led['records']} records {led['by_status']} vs {led['completed']} completed; lost "
             f"{len(led['lost'])}, recorded twice {len(led['twice'])}, ok but not completed "
             f"{len(led['ok_not_completed'])}, tokens differ {len(led['wrong_tokens'])}, rollups verified "
             f"{led['rollups_ok']} (settled {led['settled_in_s']} s after the load)",
             f"engine restarts (cascade_engine_restarts_total, pool micro): {record['restarts']}; engine pid "
             f"{record['engine_pid']['hung']} -> {record['engine_pid']['after']}",
             *(f"  supervisor: {line}" for line in record["supervisor"]),
             f"/readyz ({r['samples']} polls, 0.5 s apart):"]
    lines += [f"  {a:6.1f}-{b:6.1f} s  {s}" for a, b, s in r["spans"]]
    return "\n".join(lines)


def add_chaos_arguments(p: argparse.ArgumentParser) -> None:
    d = Faults()
    for name in Faults.__slots__:
        p.add_argument(f"--{name.replace('_', '-')}", type=float, default=getattr(d, name))
    p.add_argument("--settle-s", type=float, default=60.0, help="wait this long at most for the outbox replay")
    p.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for the engine")


def faults_of(args: argparse.Namespace) -> Faults:
    return Faults(**{name: getattr(args, name) for name in Faults.__slots__})


def chaos_scenario(args: argparse.Namespace) -> dict[str, Any]:
    """The `chaos` scenario of `loadtest.scenarios`: one run, its figures and its checks printed."""
    print(f"\n=== chaos: {args.load_s:g} s at {args.rate:g} req/s, model auto, tenants strict (fail_closed) and "
          "lenient (fail_open)", flush=True)
    record = run_chaos(args, faults_of(args))
    print(format_record(record))
    checks = check_invariants(record)
    print(format_checks(checks))
    record["checks"] = [c.to_json() for c in checks]
    return record
