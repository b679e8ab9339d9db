"""One measured wrk cell against a server process, and what the overhead benchmark's phases share around it.

A cell is `wrk` at one concurrency for `--duration` seconds against a URL, with the server process's CPU (and its
direct children's: the workers of `serve --workers N`) read from `/proc` before and after, so a phase can report
requests/s, latency and gateway CPU per request side by side. `tenant_gateway` starts the fake upstream and one
gateway whose policy has the tenants a phase compares (the response cache off and on, the output checks off and
on...); `summary` takes the medians over rounds per cell and concurrency.
"""

from __future__ import annotations

import argparse
import os
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from loadtest.bench.wrk import run_wrk
from loadtest.processes import (
    Env,
    cpu_seconds,
    free_port,
    gateway_command,
    policy_text,
    start_fake_upstream,
    wait_ready,
)

__all__ = ["Target", "measure", "summary", "tenant_gateway", "tree_cpu"]


@dataclass(slots=True)
class Target:
    name: str
    url: str
    pid: int


def measure(target: Target, lua: Path, conc: int, args: argparse.Namespace, rnd: int) -> dict[str, Any]:
    """One cell: wrk with `lua` at `conc` connections; printed as it ends."""
    load_before = os.getloadavg()[0]
    cpu_before = tree_cpu(target.pid)
    res = run_wrk(target.url, lua, conc, args.duration, args.wrk_threads, args.wrk_timeout)
    cpu = tree_cpu(target.pid) - cpu_before
    cell = {"round": rnd, "target": target.name, "concurrency": conc, **asdict(res),
            "server_cpu_ms_per_req": 1000.0 * cpu / res.requests if res.requests else None,
            "loadavg_1m": [load_before, os.getloadavg()[0]]}
    errs = f" ERRORS non2xx={res.non2xx} socket={res.socket_errors}" if res.non2xx or res.socket_errors else ""
    errs += f" (timeouts > {args.wrk_timeout:g} s: {res.timeouts})" if res.timeouts else ""
    print(f"  round {rnd} c={conc:<3} {target.name:<12} {res.rps:9.0f} req/s  p50 {res.p50_ms:7.2f} ms  "
          f"p99 {res.p99_ms:7.2f} ms  cpu {cell['server_cpu_ms_per_req'] or 0:.2f} ms/req{errs}", flush=True)
    return cell


def tree_cpu(pid: int) -> float:
    """CPU seconds of a process and its direct children (the workers of `serve --workers N`)."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = []
    return cpu_seconds(pid) + sum(cpu_seconds(int(child)) for child in children)


def tenant_gateway(env: Env, name: str, tenants_yaml: str, upstream_args: tuple[str, ...] = ()) -> tuple[str, int]:
    """Start a zero-latency fake upstream (with `upstream_args`) and one gateway (one worker, real Redis ledger)
    in front of it for both pools, its policy ending with `tenants_yaml`. Returns (gateway base URL, its pid);
    both processes are `env.procs`' as `fake-upstream-<name>` and `gateway-<name>`."""
    args = env.args
    upstream, _ = start_fake_upstream(env, f"fake-upstream-{name}", upstream_args)
    policy = env.tmp / f"gateway-{name}.yaml"
    policy.write_text(policy_text(upstream, "fake-model", upstream, "fake-model") + tenants_yaml)
    port = free_port()
    cmd, env.launcher = gateway_command(policy, port, "h1", env.prefix, args.gateway_log_level, "redis",
                                        args.gateway_cmd)
    proc = env.procs.start(f"gateway-{name}", cmd, {"CASCADE_HOME": str(env.tmp / f"{name}-home"),
                                                    "CASCADE_REDIS_URL": args.redis_url})
    base = f"http://127.0.0.1:{port}"
    wait_ready(base + "/readyz", proc, args.ready_timeout, f"gateway {name}",
               lambda: env.procs.log_tail(f"gateway-{name}"))
    return base, proc.pid


def summary(cells: list[dict[str, Any]], names: tuple[str, ...], extra: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Medians over rounds per (cell name, concurrency): requests/s, p50/p99, gateway CPU ms per request, and of
    each `extra` field the cells carry (None where none has it); errors summed."""
    rows = []
    for conc in sorted({c["concurrency"] for c in cells}):
        for name in names:
            mine = [c for c in cells if c["target"] == name and c["concurrency"] == conc]
            row: dict[str, Any] = {"cell": name, "concurrency": conc, "rounds": len(mine),
                                   "rps": statistics.median(c["rps"] for c in mine),
                                   "p50_ms": statistics.median(c["p50_ms"] for c in mine),
                                   "p99_ms": statistics.median(c["p99_ms"] for c in mine)}
            for key, out in (("server_cpu_ms_per_req", "cpu_ms_per_req"), *((e, e) for e in extra)):
                values = [c[key] for c in mine if c.get(key) is not None]
                row[out] = statistics.median(values) if values else None
            row["errors"] = sum(c["non2xx"] + c["socket_errors"] for c in mine)
            rows.append(row)
    return rows
