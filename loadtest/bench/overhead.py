"""Gateway overhead benchmark: the gateway next to its upstream called directly.

Part 1, non-streaming: a zero-latency fake vLLM upstream (`loadtest.fake_upstream`) and the gateway in
front of it (`python -m gateway serve --scorer none --no-engines`, one worker, real Redis ledger under a
throw-away key prefix) are driven by `wrk` at several concurrencies, direct and through the gateway
interleaved, for several rounds. Reported: requests/s, p50/p99 latency, added p50/p99 (gateway minus
direct, paired per round), gateway CPU per request, errors; and the ratio to LiteLLM's 85 requests/s.

Part 2, streaming: a real vLLM engine with the tiny demo "micro" model (started here, or `--engine-url`)
is called with closed-loop streaming requests (`loadtest.load.stream_client`) directly and through a gateway
with a pinned model name (no scoring), interleaved; reported: tokens/s, TTFT p50/p99, gateway/direct.
`--engine-core pinned,unpinned` measures that twice per round: with vLLM's engine-core process on its
worker's cores (what the supervisor does, `backends.engines.cpu_pinning`) and free to run anywhere (vLLM's default).

Targets: gateway >= 850 requests/s (10x LiteLLM's 85) at concurrency 16 and 64; added p50
< 1.5 ms at concurrency 1; streaming tokens/s through the gateway >= 95% of direct. Results go to
`loadtest/results/overhead-<timestamp>.json`. Run `python -m loadtest.bench.overhead --help`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from backends.clients.transports import TRANSPORTS
from backends.engines.cpu_pinning import cpus_of, engine_processes, set_affinity
from loadtest.bench.cells import Target, measure
from loadtest.bench.report import (
    LITELLM_RPS,
    TARGET_ADDED_P50_MS,
    TARGET_RPS,
    TARGET_STREAM_RATIO,
    print_report,
    summarise_nonstream,
    summarise_stream,
    top_frames,
    verdicts,
)
from loadtest.bench.wrk import WRK_INSTALL_HINT, chat_body, lua_script, run_wrk
from loadtest.processes import (
    Env,
    Procs,
    cleanup_redis,
    free_port,
    gateway_command,
    policy_text,
    post_json,
    start_fake_upstream,
    start_gateway,
    wait_ready,
)

__all__ = ["Target", "build_parser", "main", "nonstream_phase", "profile_gateway", "run", "stream_phase"]

RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"


# --------------------------------------------------------------------------------- non-streaming phase


def _check_target(target: Target, body: bytes) -> None:
    status, headers, payload = post_json(target.url, body)
    if status != 200 or b'"choices"' not in payload:
        raise RuntimeError(f"{target.name}: probe request failed: HTTP {status}: {payload[:300]!r}")
    if target.name != "direct" and "x-cascade-pool" not in {k.lower() for k in headers}:
        raise RuntimeError(f"{target.name}: no x-cascade-pool header; is this the gateway?")


def _start_workers(env: Env, name: str, upstream_url: str, model: str, transport: str, workers: int) -> tuple[str, int]:
    """Like `processes.start_gateway`, with `serve --workers N`; returns (base URL, parent pid)."""
    policy = env.tmp / f"{name}.yaml"
    policy.write_text(policy_text(upstream_url, model, upstream_url, model))
    port, args = free_port(), env.args
    cmd, env.launcher = gateway_command(policy, port, transport, env.prefix, args.gateway_log_level, args.ledger,
                                        args.gateway_cmd)
    extra = {"CASCADE_HOME": str(env.tmp / f"{name}-home"), "CASCADE_REDIS_URL": args.redis_url}
    proc = env.procs.start(name, [*cmd, "--workers", str(workers)], extra)
    base = f"http://127.0.0.1:{port}"
    wait_ready(base + "/readyz", proc, args.ready_timeout, f"gateway {name}", lambda: env.procs.log_tail(name))
    return base, proc.pid


def _nonstream_targets(env: Env) -> list[Target]:
    args = env.args
    base, upstream_pid = start_fake_upstream(env, "fake-upstream")
    chat = "/v1/chat/completions"
    targets = [Target("direct", base + chat, upstream_pid)]
    for transport in args.transports:
        for workers in args.workers:
            if workers == 1:
                url, pid = start_gateway(env, f"gateway-{transport}", base, "fake-model", transport)
                targets.append(Target(f"gw-{transport}", url + chat, pid))
            else:
                name = f"gw-{transport}-w{workers}"
                url, pid = _start_workers(env, f"gateway-{transport}-w{workers}", base, "fake-model", transport,
                                          workers)
                targets.append(Target(name, url + chat, pid))
    return targets


def worker_scaling(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """requests/s of each `gw-<transport>-w<N>` over `gw-<transport>` (one worker), per concurrency."""
    rps = {(r["target"], r["concurrency"]): r["rps"] for r in rows}
    out = []
    for (name, conc), value in rps.items():
        base, _, workers = name.rpartition("-w")
        one = rps.get((base, conc))
        if name.startswith("gw-") and workers.isdigit() and one and value is not None:
            out.append({"target": name, "workers": int(workers), "concurrency": conc, "rps": value,
                        "rps_one_worker": one, "ratio": value / one})
    return out


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
            cells.extend(measure(t, lua, conc, args, rnd) for t in order)
    profile = profile_gateway(env, targets[1], lua) if args.profile else None
    summary = summarise_nonstream(cells)
    scaling = worker_scaling(summary)
    for row in scaling:
        print(f"workers {row['workers']} vs 1 at c={row['concurrency']}: {row['rps']:.0f} / "
              f"{row['rps_one_worker']:.0f} requests/s = {row['ratio']:.2f}x ({os.cpu_count()} CPUs, shared with "
              "wrk and the fake upstream)", flush=True)
    return {"cells": cells, "summary": summary, "profile": profile, "worker_scaling": scaling}


# ---------------------------------------------------------------------------------------- profiling

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


async def _engine(env: Env, stack: contextlib.AsyncExitStack) -> tuple[str, int | None]:
    """The engine to stream from and its API server's pid: `--engine-url` (pid None), or one replica of the
    demo micro model started here (the supervisor pins its engine core, as in production)."""
    args = env.args
    if args.engine_url:
        return str(args.engine_url).rstrip("/"), None
    from backends.engines.supervisor import EngineSupervisor
    from policies.schema import EngineSpec

    spec = EngineSpec(model="demo:micro", served_name=args.engine_model, max_model_len=1024, dtype="bfloat16",
                      kv_cache_space_gib=1, base_port=free_port(), startup_timeout_s=args.engine_timeout,
                      extra_args=("--enforce-eager",) if args.engine_eager else ())
    sup = EngineSupervisor("bench-micro", spec, progress=lambda m: print(f"  engine: {m}", flush=True))
    stack.push_async_callback(sup.aclose)
    print("starting a vLLM engine with the demo micro model (1-2 minutes)...", flush=True)
    await sup.start()
    return sup.urls[0], sup.replicas[0].pid


def _place_engine_core(api_pid: int, layout: str) -> None:
    """`pinned`: the engine core on its worker's cores (what the supervisor does); `unpinned`: free to run on
    any core of this machine (vLLM's own default)."""
    procs = engine_processes(api_pid)
    cpus = cpus_of(procs.workers) if layout == "pinned" else frozenset(os.sched_getaffinity(0))
    if not procs.engine_cores or not cpus:
        raise RuntimeError(f"no vLLM engine core or worker found under pid {api_pid}")
    for pid in procs.engine_cores:
        set_affinity(pid, cpus)


async def _stream_cell(name: str, url: str, env: Env, rnd: int) -> dict[str, Any]:
    from loadtest.load.stream_client import run_closed_loop

    args = env.args
    load_before = os.getloadavg()[0]
    res = await run_closed_loop(url, args.engine_model, args.stream_concurrency, args.stream_duration,
                                args.stream_max_tokens)
    cell = {"round": rnd, "target": name, **res.to_json(), "loadavg_1m": [load_before, os.getloadavg()[0]]}
    errs = f"  ERRORS {res.errors}: {res.error_examples[:1]}" if res.errors else ""
    print(f"  round {rnd} {name:<8} {res.tokens_per_s:8.1f} tok/s  {res.requests:4d} req  "
          f"TTFT p50 {res.ttft_p50_ms or 0:7.1f} ms  p99 {res.ttft_p99_ms or 0:7.1f} ms{errs}", flush=True)
    return cell


def _start_bare_relay(env: Env, engine: str) -> str:
    """`loadtest.bench.bare_relay` in front of the engine: what any extra Python hop costs on this machine."""
    port, name = free_port(), "stream-bare-relay"
    proc = env.procs.start(name, [sys.executable, "-m", "loadtest.bench.bare_relay", "--upstream", engine,
                                  "--port", str(port)])
    base = f"http://127.0.0.1:{port}"
    wait_ready(base + "/health", proc, env.args.ready_timeout, "bare relay", lambda: env.procs.log_tail(name))
    return base


async def stream_phase(env: Env) -> dict[str, Any]:
    """Closed-loop streaming at `--stream-concurrency`: the engine directly, the bare relay and one gateway per
    `--stream-transport` (the first is `gateway`, the others `gateway-<transport>`), round-robin per round."""
    from loadtest.load.stream_client import run_closed_loop

    args = env.args
    layouts = args.engine_core
    if args.engine_url and layouts != ["pinned"]:
        raise RuntimeError("--engine-core places the engine started here; it cannot move one given by --engine-url")
    async with contextlib.AsyncExitStack() as stack:
        engine, api_pid = await _engine(env, stack)
        targets = [("direct", engine)]
        if not args.no_bare_relay:
            targets.append(("bare-relay", await asyncio.to_thread(_start_bare_relay, env, engine)))
        for i, transport in enumerate(args.stream_transport):
            name = "gateway" if i == 0 else f"gateway-{transport}"
            url, _ = await asyncio.to_thread(start_gateway, env, f"stream-{name}", engine, args.engine_model,
                                             transport)
            targets.append((name, url))
        for _, url in targets:  # warm-up: not recorded
            res = await run_closed_loop(url, args.engine_model, args.stream_concurrency, args.warmup, 8)
            if res.errors or not res.requests:
                raise RuntimeError(f"streaming warm-up against {url} failed: {res.error_examples}")
        cells: list[dict[str, Any]] = []
        for rnd in range(1, args.stream_rounds + 1):
            shift = (rnd - 1) % len(targets)  # each target takes each position in the order over the rounds
            for layout in layouts:
                if api_pid is not None:
                    _place_engine_core(api_pid, layout)
                for name, url in targets[shift:] + targets[:shift]:
                    cells.append(await _stream_cell(name, url, env, rnd) | {"engine_core": layout})
        for name, _ in targets[1:]:  # each started as process "stream-<name>"
            env.procs.stop(f"stream-{name}")
    by_layout = {layout: summarise_stream([c for c in cells if c["engine_core"] == layout]) for layout in layouts}
    return {"engine_url": engine, "cells": cells, "summary": by_layout[layouts[0]], "by_engine_core": by_layout}


# ---------------------------------------------------------------------------------------------- main


def _csv_ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _layouts(text: str) -> list[str]:
    words = [x.strip() for x in text.split(",") if x.strip()]
    if not words or any(w not in ("pinned", "unpinned") for w in words):
        raise argparse.ArgumentTypeError(f"{text!r}: expected pinned, unpinned or both, comma-separated")
    return list(dict.fromkeys(words))


def _csv_words(text: str) -> list[str]:
    words = [x.strip() for x in text.split(",") if x.strip()]
    bad = [w for w in words if w not in TRANSPORTS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown transport(s) {bad}; use any of {', '.join(TRANSPORTS)}")
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
    g.add_argument("--transports", type=_csv_words, default=["h1", "aiohttp"],
                   help="gateways to measure, one per upstream transport (default h1,aiohttp; the first is "
                   "judged against the targets)")
    g.add_argument("--workers", type=_csv_ints, default=[1],
                   help="gateway worker counts to compare, e.g. 1,2 (`serve --workers N`; default 1)")
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
    g.add_argument("--stream-transport", type=_csv_words, default=["h1", "aiohttp"], metavar="LIST",
                   help="gateways for the streaming phase, one per upstream transport (h1, aiohttp, httpx; default "
                   "h1,aiohttp); the first is the one the target is checked on")
    g.add_argument("--engine-core", type=_layouts, default=["pinned"], metavar="LIST",
                   help="where vLLM's engine-core process may run, measured interleaved per round: pinned (on its "
                        "worker's cores, what the supervisor does) and/or unpinned (any core, vLLM's default); the "
                        "first is the one judged (default pinned)")
    g.add_argument("--no-bare-relay", action="store_true",
                   help="skip the reference relay (loadtest.bench.bare_relay: the least any Python hop costs)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m loadtest.bench.overhead", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Needs wrk (apt-get install -y wrk), Redis on --redis-url, and for --profile py-spy "
        "(pip install py-spy). Every process started here is stopped at the end, also on Ctrl-C.",
    )
    p.add_argument("--skip-nonstream", action="store_true", help="skip the wrk part")
    p.add_argument("--skip-stream", action="store_true", help="skip the streaming part (no engine needed)")
    p.add_argument("--cache", action="store_true", help="also the response-cache phase: gateway CPU per request "
                   "with the exact cache off, missing and hitting (loadtest.bench.overhead_cache)")
    p.add_argument("--checks", action="store_true", help="also the output-checks phase: gateway CPU per request "
                   "with every output check off and on (loadtest.bench.overhead_checks)")
    p.add_argument("--redis-url", default=os.environ.get("CASCADE_REDIS_URL", "redis://127.0.0.1:6379/0"),
                   help="Redis of the ledger; keys go under bench:<uuid>: and are deleted at the end")
    p.add_argument("--ready-timeout", type=float, default=60, help="seconds to wait for a gateway/upstream")
    p.add_argument("--ledger", choices=["redis", "memory"], default="redis",
                   help="gateway --ledger (default redis, as in production; memory shows the ledger's cost)")
    p.add_argument("--gateway-cmd", help="command taking `serve ...` arguments instead of `python -m gateway`, "
                   "e.g. 'env -C /tmp/old-tree .venv-python -m gateway' for an A/B run against another tree (-C: "
                   "python -m puts the working directory first on sys.path, ahead of PYTHONPATH)")
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
    if env.args.cache:
        from loadtest.bench.overhead_cache import cache_phase

        results["cache"] = _tenant_phase(env, "response cache: off / miss / hit", cache_phase, "hit_share")
    if env.args.checks:
        from loadtest.bench.overhead_checks import checks_phase

        results["checks"] = _tenant_phase(env, "output checks: off / on", checks_phase, "errors")
    if not env.args.skip_stream:
        print("== streaming tokens/s ==", flush=True)
        results["stream"] = asyncio.run(stream_phase(env))
    results["meta"]["gateway_launcher"] = env.launcher
    results["meta"]["loadavg_end"] = os.getloadavg()
    gateway = f"gw-{env.args.transports[0]}" if env.args.transports else "gw-aiohttp"
    results["verdicts"] = verdicts(results.get("nonstream"), results.get("stream"), gateway)
    return results


def _tenant_phase(env: Env, title: str, phase: Callable[[Env], dict[str, Any]], last: str) -> dict[str, Any]:
    """Run a phase that compares tenants of one gateway (`loadtest.bench.cells`) and print its medians."""
    print(f"== {title} ==", flush=True)
    result = phase(env)
    for row in result["summary"]:
        print(f"  c={row['concurrency']:<3} {row['cell']:<11} {row['rps']:8.0f} req/s  p50 {row['p50_ms']:6.2f} ms  "
              f"cpu {row['cpu_ms_per_req'] or 0:.3f} ms/req  {last.replace('_', ' ')} {row[last]}", flush=True)
    env.procs.stop_all()
    return result


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
