"""The tail at saturation: p99 against p50 of the gateway as served, with the collector's pauses beside them.

Setup (what production runs, not the overhead benchmark's bare `--scorer none`): a zero-latency fake vLLM upstream
(`loadtest.fake_upstream`) behind two remote pools, the gateway with the default trained classifier loaded
(`--scorer classifier`; requests say `model: auto`, so every one is scored and routed), the real Redis ledger
under a throw-away prefix, one worker. `wrk` drives each target at each concurrency, JSON answers and streamed
ones, the upstream directly and each gateway interleaved, for several rounds (the order flips every round).

Gateways compared in the same run (`--variants`):
- `freeze`: this tree as `cascade serve` runs it (the long-lived heap frozen out of the cyclic collector);
- `nofreeze`: this tree with `--no-gc-freeze`;
- `old`: `--old-cmd` (another tree's `python -m gateway`, e.g. `env -C /tmp/old .venv/bin/python -m gateway`).

Per cell: requests/s, p50, p99, p99/p50, gateway CPU per request, and from the gateway's own /metrics (read before
and after the cell) its cyclic collections by generation with their total and largest bucketed pause
(`cascade_gc_pause_seconds`, absent in a tree without it) and its event-loop lag above 25 ms
(`cascade_event_loop_lag_seconds`). `--soak S` then drives every gateway at c=16 for S seconds and prints
each one's RSS once a minute (does a freeze leak?). Results go to `loadtest/results/tail-<timestamp>.json`.

Run: `python -m loadtest.bench.tail` (about 4 minutes with the defaults; `--help`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from loadtest.bench.cells import Target, measure
from loadtest.bench.scorer_prompts import timing_prompts
from loadtest.bench.wrk import WRK_INSTALL_HINT, distinct_lua, lua_script, run_wrk
from loadtest.processes import (
    Env,
    Procs,
    cleanup_redis,
    cpu_seconds,
    free_port,
    gateway_command,
    policy_text,
    start_fake_upstream,
    wait_ready,
)

__all__ = ["build_parser", "gc_counts", "main", "summarise"]

RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"
BODIES = ("json", "stream", "distinct", "pinned")
BODY = {"model": "auto", "max_tokens": 16, "messages": [{"role": "user", "content": "What is the capital of France?"}]}
LAG_OVER_S = 0.025  # event-loop lag bucket bound: wakes later than this count as stalls


def gc_counts(metrics_text: str) -> dict[str, float]:
    """From a Prometheus exposition: collections and pause seconds per generation (`gen<N>_count`, `gen<N>_sum`,
    `gen<N>_over_10ms`), objects freed from reference cycles (`cycles`), and loop-lag wakes over `LAG_OVER_S`
    (`lag_over`) and in all (`lag_count`)."""
    out: dict[str, float] = {}
    lag_le: float | None = None
    for line in metrics_text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name, value = line.rsplit(" ", 1)
        if name.startswith("cascade_gc_pause_seconds"):
            gen = name.split('generation="', 1)[1].split('"', 1)[0]
            if name.startswith("cascade_gc_pause_seconds_count"):
                out[f"gen{gen}_count"] = float(value)
            elif name.startswith("cascade_gc_pause_seconds_sum"):
                out[f"gen{gen}_sum"] = float(value)
            elif 'le="0.01"' in name:
                out[f"gen{gen}_le10ms"] = float(value)
        elif name.startswith("cascade_gc_collected_objects_total"):
            out["cycles"] = out.get("cycles", 0.0) + float(value)
        elif name.startswith("cascade_event_loop_lag_seconds_count"):
            out["lag_count"] = float(value)
        elif name.startswith("cascade_event_loop_lag_seconds_bucket") and f'le="{LAG_OVER_S}"' in name:
            lag_le = float(value)
    for gen in "012":
        if f"gen{gen}_count" in out:
            out[f"gen{gen}_over_10ms"] = out[f"gen{gen}_count"] - out.pop(f"gen{gen}_le10ms", 0.0)
    if lag_le is not None and "lag_count" in out:
        out["lag_over"] = out["lag_count"] - lag_le
    return out


def _metrics(base: str) -> dict[str, float]:
    try:
        with urllib.request.urlopen(base + "/metrics", timeout=10) as resp:
            return gc_counts(resp.read().decode())
    except OSError:
        return {}


def _rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _start(env: Env, name: str, upstream: str, extra: list[str], launcher: str | None) -> Target:
    args = env.args
    policy = env.tmp / f"{name}.yaml"
    policy.write_text(policy_text(upstream, "fake-model", upstream, "fake-model"))
    port = free_port()
    cmd, _ = gateway_command(policy, port, "h1", env.prefix + name + ":", "WARNING", "redis", launcher,
                             scorer=args.scorer, extra=extra)
    home = env.tmp / f"{name}-home"
    home.mkdir()
    (home / "router-cache").symlink_to(_router_cache(), target_is_directory=True)
    proc = env.procs.start(name, cmd, {"CASCADE_HOME": str(home), "CASCADE_REDIS_URL": args.redis_url})
    base = f"http://127.0.0.1:{port}"
    wait_ready(base + "/readyz", proc, args.ready_timeout, f"gateway {name}", lambda: env.procs.log_tail(name))
    _await_overflow(base, name, proc.pid, args.ready_timeout)
    return Target(name, base + "/v1/chat/completions", proc.pid)


def _router_cache() -> Path:
    """The user's router cache ($CASCADE_HOME or ./.cascade): each gateway has its own home, but the embedding
    model's caches are built once (the overflow table takes minutes on a loaded machine) and shared."""
    home = Path(os.environ.get("CASCADE_HOME") or ".cascade").expanduser().resolve()
    (home / "router-cache").mkdir(parents=True, exist_ok=True)
    return home / "router-cache"


def _await_overflow(base: str, name: str, pid: int, timeout_s: float) -> None:
    """Until the gateway's router overflow model has loaded (`/readyz` router_overflow; a tree without that field:
    until the process idles, under 5% of a core over 3 s): a first start builds its table in the background, and
    measuring during that build measures the build."""
    deadline, said = time.monotonic() + timeout_s, False
    while time.monotonic() < deadline:
        with urllib.request.urlopen(base + "/readyz", timeout=10) as resp:
            state = json.loads(resp.read()).get("router_overflow")
        if state is None:
            before = cpu_seconds(pid)
            time.sleep(3.0)
            if cpu_seconds(pid) - before < 0.15:
                return
        elif state != "loading":
            return
        if not said:
            print(f"  {name}: waiting for the router overflow model to load (a first build takes minutes)",
                  flush=True)
            said = True
        time.sleep(2.0)
    raise RuntimeError(f"gateway {name}: the router overflow model was still loading after {timeout_s:g} s")


def _targets(env: Env) -> list[Target]:
    args = env.args
    upstream, upstream_pid = start_fake_upstream(env, "upstream")
    targets = [Target("direct", upstream + "/v1/chat/completions", upstream_pid)]
    variants = {"freeze": ([], None), "nofreeze": (["--no-gc-freeze"], None), "old": ([], args.old_cmd)}
    for name in args.variants:
        if name == "old" and not args.old_cmd:
            raise RuntimeError("variant 'old' needs --old-cmd")
        print(f"starting gateway {name} (--scorer {args.scorer})...", flush=True)
        targets.append(_start(env, name, upstream, *variants[name]))
    return targets


def _cell(target: Target, lua: Path, conc: int, body: str, env: Env, rnd: int) -> dict[str, Any]:
    base = target.url.rsplit("/v1/", 1)[0]
    before = _metrics(base) if target.name != "direct" else {}
    cell = measure(Target(f"{target.name}/{body}", target.url, target.pid), lua, conc, env.args, rnd)
    after = _metrics(base) if target.name != "direct" else {}
    cell["gc"] = {k: after[k] - before.get(k, 0.0) for k in after}
    return cell


def summarise(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Medians over rounds per (target/body, concurrency); `tail` = p99/p50; gc figures summed over rounds."""
    import statistics

    rows = []
    for key in dict.fromkeys((c["target"], c["concurrency"]) for c in cells):
        mine = [c for c in cells if (c["target"], c["concurrency"]) == key]
        gc: dict[str, float] = {}
        for c in mine:
            for k, v in c.get("gc", {}).items():
                gc[k] = gc.get(k, 0.0) + v
        cpu = [c["server_cpu_ms_per_req"] for c in mine if c["server_cpu_ms_per_req"] is not None]
        rows.append({"target": key[0], "concurrency": key[1], "rounds": len(mine),
                     "rps": statistics.median(c["rps"] for c in mine),
                     "p50_ms": statistics.median(c["p50_ms"] for c in mine),
                     "p99_ms": statistics.median(c["p99_ms"] for c in mine),
                     "tail": statistics.median(c["p99_ms"] / c["p50_ms"] for c in mine if c["p50_ms"] > 0),
                     "cpu_ms_per_req": statistics.median(cpu) if cpu else None,
                     "errors": sum(c["non2xx"] + c["socket_errors"] for c in mine), "gc": gc,
                     "requests": sum(c["requests"] for c in mine)})
    return rows


def _print(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"\nwrk -t1, medians of {args.rounds} rounds x {args.duration:g} s; tail = p99/p50 (target <= 3); "
          "gc: collections of generation 2 in all rounds, their summed pause, collections of any generation over "
          f"10 ms; lag: event-loop wakes over {LAG_OVER_S * 1000:g} ms; cycles/req: objects freed from reference "
          "cycles per request")
    print(f"{'c':>3}  {'target':<16} {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'tail':>5} {'cpu ms/req':>10} "
          f"{'err':>4} {'gen2':>5} {'gen2 ms':>8} {'>10ms':>5} {'lag':>4} {'cycles/req':>10}")
    for r in rows:
        gc = r["gc"]
        over = sum(gc.get(f"gen{g}_over_10ms", 0.0) for g in "012")
        gen2 = f"{gc['gen2_count']:.0f}" if "gen2_count" in gc else "-"
        gen2_ms = f"{1000 * gc['gen2_sum']:.0f}" if "gen2_sum" in gc else "-"
        lag = f"{gc['lag_over']:.0f}" if "lag_over" in gc else "-"
        cpu = "-" if r["cpu_ms_per_req"] is None else f"{r['cpu_ms_per_req']:.3f}"
        cycles = f"{gc['cycles'] / r['requests']:.2f}" if "cycles" in gc and r["requests"] else "-"
        print(f"{r['concurrency']:>3}  {r['target']:<16} {r['rps']:7.0f} {r['p50_ms']:7.2f} {r['p99_ms']:7.2f} "
              f"{r['tail']:5.1f} {cpu:>10} {r['errors']:>4} {gen2:>5} {gen2_ms:>8} "
              f"{over if 'gen2_count' in gc else '-':>5} {lag:>4} {cycles:>10}")


def distinct_share(rows: list[dict[str, Any]], cells: list[dict[str, Any]]) -> list[str]:
    """Routed requests with every prompt different against pinned ones (no score), per gateway and concurrency:
    the share of the pinned rate the scorer leaves (issue 55's target: at least 0.5 at c=16), from the medians over
    rounds, then round by round (distinct against pinned of the same round: the host drifts between rounds)."""
    rates = {(r["target"], r["concurrency"]): r["rps"] for r in rows}
    by_round = {(c["target"], c["concurrency"], c["round"]): c["rps"] for c in cells}
    lines = []
    for (target, conc), rps in rates.items():
        name, _, body = target.rpartition("/")
        pinned = rates.get((f"{name}/pinned", conc))
        if body == "distinct" and name != "direct" and pinned:
            shares = [rate / by_round[(f"{name}/pinned", c, r)] for (t, c, r), rate in sorted(by_round.items())
                      if t == target and c == conc and by_round.get((f"{name}/pinned", c, r))]
            lines.append(f"c={conc} {name}: routed with distinct prompts {rps:.0f} req/s = {rps / pinned:.2f} of "
                         f"pinned ({pinned:.0f} req/s); round by round {', '.join(f'{v:.2f}' for v in shares)} "
                         f"({sum(v >= 0.5 for v in shares)} of {len(shares)} rounds at 0.5 or more)")
    return lines


def _soak(env: Env, targets: list[Target], lua: Path) -> dict[str, list[float | None]]:
    """Each gateway at c=16 for `--soak` seconds in one-minute slices, round-robin; RSS (MiB) after each."""
    rss: dict[str, list[float | None]] = {t.name: [_rss_mib(t.pid)] for t in targets[1:]}
    end = time.monotonic() + env.args.soak
    while time.monotonic() < end:
        for t in targets[1:]:
            run_wrk(t.url, lua, 16, 60 / len(targets[1:]), 1, env.args.wrk_timeout)
            rss[t.name].append(_rss_mib(t.pid))
        print("  RSS MiB: " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in rss.items() if v[-1] is not None), flush=True)
    return rss


def run(env: Env) -> dict[str, Any]:
    args = env.args
    targets = _targets(env)
    luas = {body: env.tmp / f"{body}.lua" for body in BODIES}
    luas["json"].write_text(lua_script(json.dumps(BODY).encode()))
    luas["stream"].write_text(lua_script(json.dumps(BODY | {"stream": True}).encode()))
    luas["pinned"].write_text(lua_script(json.dumps(BODY | {"model": "micro"}).encode()))
    prompts = timing_prompts(3000, 1).prompts  # real prompts beside short chat ones, as the scorer bench's
    luas["distinct"].write_text(distinct_lua(prompts, {k: v for k, v in BODY.items() if k != "messages"}))
    bodies = [b for b in BODIES if b in args.bodies]
    for t in targets:
        run_wrk(t.url, luas["json"], 16, args.warmup, 1, args.wrk_timeout)  # warm-up, not recorded
    cells: list[dict[str, Any]] = []
    for rnd in range(1, args.rounds + 1):
        for conc in args.concurrency:
            for body in bodies:
                order = targets if rnd % 2 else list(reversed(targets))
                cells.extend(_cell(t, luas[body], conc, body, env, rnd) for t in order)
    rows = summarise(cells)
    _print(rows, args)
    for line in distinct_share(rows, cells):
        print(line)
    result: dict[str, Any] = {"cells": cells, "summary": rows,
                              "rss_mib_after": {t.name: _rss_mib(t.pid) for t in targets[1:]}}
    if args.soak:
        print(f"\nsoak: c=16 JSON for {args.soak:g} s, RSS per gateway", flush=True)
        result["soak_rss_mib"] = _soak(env, targets, luas["json"])
    return result


def _words(text: str) -> list[str]:
    return [w.strip() for w in text.split(",") if w.strip()]


def _ints(text: str) -> list[int]:
    return [int(w) for w in _words(text)]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.tail", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Needs wrk (apt-get install -y wrk) and Redis. Every process started here "
                                "is stopped at the end, also on Ctrl-C.")
    p.add_argument("--variants", type=_words, default=["freeze", "nofreeze"],
                   help="gateways to compare: freeze, nofreeze, old (default freeze,nofreeze)")
    p.add_argument("--old-cmd", help="the `old` variant's launcher taking `serve ...` arguments")
    p.add_argument("--scorer", default="classifier", choices=["classifier", "length", "none"],
                   help="gateway --scorer (default classifier: the default trained router is loaded and scores)")
    p.add_argument("--concurrency", type=_ints, default=[16, 64],
                   help="wrk connections (default 16,64)")
    p.add_argument("--bodies", type=_words, default=["json", "stream"],
                   help="json (one prompt, routed), stream, distinct (routed, every prompt different: each is scored), "
                   "pinned (one prompt, `model: micro`: not scored); default json,stream")
    p.add_argument("--duration", type=float, default=8.0, help="seconds per cell (default 8)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--warmup", type=float, default=3.0, help="warm-up seconds per target (default 3)")
    p.add_argument("--wrk-threads", type=int, default=1, help="wrk threads (default 1)")
    p.add_argument("--wrk-timeout", type=float, default=10.0, help="wrk per-request timeout in s (default 10)")
    p.add_argument("--soak", type=float, default=0.0, help="then this many seconds at c=16 printing RSS (0: none)")
    p.add_argument("--redis-url", default=os.environ.get("CASCADE_REDIS_URL", "redis://127.0.0.1:6379/0"))
    p.add_argument("--ready-timeout", type=float, default=600,
                   help="seconds to wait for a gateway and its router overflow model (default 600)")
    p.add_argument("--out", type=Path, help="JSON path (default loadtest/results/tail-<timestamp>.json)")
    return p


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    bad = [v for v in args.variants if v not in ("freeze", "nofreeze", "old")]
    if bad:
        print(f"error: unknown variant(s) {bad}: use freeze, nofreeze, old", file=sys.stderr)
        return 2
    if shutil.which("wrk") is None:
        print(WRK_INSTALL_HINT, file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _interrupt)
    tmp = Path(tempfile.mkdtemp(prefix="tail-bench-"))
    env = Env(args, tmp, Procs(tmp), f"bench:{uuid.uuid4().hex}:")
    try:
        result = run(env)
    except KeyboardInterrupt:
        print("interrupted; stopping everything started here", file=sys.stderr)
        return 130
    except (RuntimeError, OSError) as exc:
        print(f"benchmark failed: {exc}\nlogs kept in {tmp}", file=sys.stderr)
        return 2
    finally:
        env.procs.stop_all()
        cleanup_redis(args.redis_url, env.prefix)
    result["meta"] = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cpus": os.cpu_count(),
                      "loadavg_end": os.getloadavg(), "args": {k: str(v) for k, v in vars(args).items()}}
    out = args.out or RESULTS_DIR / f"tail-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"\nresults written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
