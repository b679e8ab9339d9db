"""The gateway's added latency and CPU per request on each OpenAI endpoint: chat, Responses, completions, side by
side, streamed and not.

A zero-latency fake vLLM upstream (`loadtest.fake_upstream`, which serves all three endpoints) and one gateway in
front of it (`python -m gateway serve --scorer none --no-engines`, one worker, the real Redis ledger under a
throw-away prefix, every request pinned to the micro pool: no scoring, so the figures compare the endpoints' own
paths) are driven by `wrk` with the same short prompt on each endpoint, 16 tokens answered. A fourth cell,
`responses-via-chat`, sends the Responses request to the flagship pool, marked `responses: chat`: the gateway
translates it to chat and the answer back (its direct cell is the chat request the engine then gets). For every
round, concurrency, endpoint and mode, the upstream is called directly and through the gateway back to back (the
order alternates per round). Reported per cell, as medians over rounds: requests/s, p50/p99, the added p50
(gateway minus direct, paired per round), and the gateway process's CPU per completed request (`/proc`).

Run: `python -m loadtest.bench.overhead_endpoints --rounds 3 --duration 5 --concurrency 1,16`; results go to
`loadtest/results/overhead-endpoints-<timestamp>.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import orjson

from loadtest.bench.wrk import lua_script, run_wrk
from loadtest.processes import (
    Procs,
    cleanup_redis,
    cpu_seconds,
    free_port,
    gateway_command,
    policy_text,
    post_json,
    wait_ready,
)

__all__ = ["ENDPOINT_BODIES", "main", "summary"]

PROMPT = "Say hello to the new team in one short sentence."
_CHAT = ("/v1/chat/completions", {"model": "micro", "messages": [{"role": "user", "content": PROMPT}],
                                  "max_tokens": 16})
_RESPONSES = ("/v1/responses", {"model": "micro", "input": PROMPT, "max_output_tokens": 16})
# name -> ((gateway path, body), (direct path, body)): the direct call is what the engine is asked
ENDPOINT_BODIES: dict[str, tuple[tuple[str, dict[str, Any]], tuple[str, dict[str, Any]]]] = {
    "chat": (_CHAT, _CHAT),
    "responses": (_RESPONSES, _RESPONSES),
    "completions": (("/v1/completions", {"model": "micro", "prompt": PROMPT, "max_tokens": 16}),) * 2,
    "responses-via-chat": (("/v1/responses", {**_RESPONSES[1], "model": "flagship"}), _CHAT),
}
RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"


def _scripts(tmp: Path) -> dict[tuple[str, bool, str], tuple[str, Path]]:
    """(endpoint, stream, target) -> (path, wrk script)."""
    out = {}
    for name, calls in ENDPOINT_BODIES.items():
        for stream in (False, True):
            for target, (path, body) in zip(("gateway", "direct"), calls, strict=True):
                lua = tmp / f"{name}-{'stream' if stream else 'json'}-{target}.lua"
                lua.write_text(lua_script(orjson.dumps({**body, "stream": stream})))
                out[(name, stream, target)] = (path, lua)
    return out


def _cell(url: str, lua: Path, pid: int | None, conc: int, args: argparse.Namespace) -> dict[str, Any]:
    before = cpu_seconds(pid) if pid is not None else 0.0
    res = run_wrk(url, lua, conc, args.duration, args.wrk_threads, 10.0)
    cpu = (cpu_seconds(pid) - before) if pid is not None else None
    return {"rps": res.rps, "p50_ms": res.p50_ms, "p99_ms": res.p99_ms, "requests": res.requests,
            "errors": res.non2xx + res.socket_errors,
            "cpu_ms_per_req": None if cpu is None or not res.requests else 1000.0 * cpu / res.requests}


def _check(base: str, path: str, body: dict[str, Any], pool: str | None = None) -> None:
    status, headers, payload = post_json(base + path, orjson.dumps(body))
    if status != 200:
        raise RuntimeError(f"{path}: HTTP {status}: {payload[:300]!r}")
    lower = {k.lower(): v for k, v in headers.items()}
    if pool is not None and lower.get("x-cascade-pool") != pool:
        raise RuntimeError(f"{path}: answered by {lower.get('x-cascade-pool')}, not {pool}")
    if pool == "flagship" and b'"resp_chatcmpl' not in payload:
        raise RuntimeError(f"{path}: the flagship answer was not translated from chat: {payload[:200]!r}")


def run(args: argparse.Namespace, tmp: Path, procs: Procs, prefix: str) -> list[dict[str, Any]]:
    up_port, gw_port = free_port(), free_port()
    up = procs.start("fake-upstream", [sys.executable, "-m", "loadtest.fake_upstream", "--port", str(up_port)])
    upstream = f"http://127.0.0.1:{up_port}"
    wait_ready(upstream + "/health", up, 60, "fake upstream", lambda: procs.log_tail("fake-upstream"))
    policy = tmp / "policy.yaml"
    text = policy_text(upstream, "fake", upstream, "fake")
    policy.write_text(text.replace("    model: fake\n    price: {input_per_mtok: \"3.00\"",
                                   "    model: fake\n    responses: chat\n    price: {input_per_mtok: \"3.00\"", 1))
    if "responses: chat" not in policy.read_text():
        raise RuntimeError("could not mark the flagship pool chat-only")
    cmd, _ = gateway_command(policy, gw_port, "h1", prefix, "warning")
    gw = procs.start("gateway", cmd, {"CASCADE_HOME": str(tmp / "home"), "CASCADE_REDIS_URL": args.redis_url})
    gateway = f"http://127.0.0.1:{gw_port}"
    wait_ready(gateway + "/readyz", gw, 60, "gateway", lambda: procs.log_tail("gateway"))
    for (path, body), (direct_path, direct_body) in ENDPOINT_BODIES.values():
        _check(upstream, direct_path, direct_body)
        _check(gateway, path, body, body["model"])
    cells = []
    for rnd in range(1, args.rounds + 1):
        for conc in args.concurrency:
            scripts = _scripts(tmp)
            for name, stream in sorted({(n, s) for n, s, _ in scripts}, key=lambda k: (k[1], k[0])):
                order = (("direct", upstream, None), ("gateway", gateway, gw.pid))
                for target, base, pid in order if rnd % 2 else order[::-1]:
                    path, lua = scripts[(name, stream, target)]
                    cell = {"round": rnd, "concurrency": conc, "endpoint": name, "stream": stream, "target": target,
                            **_cell(base + path, lua, pid, conc, args), "loadavg_1m": os.getloadavg()[0]}
                    cells.append(cell)
                    print(f"  r{rnd} c={conc:<3} {name:<18} {'sse ' if stream else 'json'} {target:<8} "
                          f"{cell['rps']:8.0f} req/s  p50 {cell['p50_ms']:6.2f} ms  "
                          f"cpu {cell['cpu_ms_per_req'] or 0:.3f} ms/req", flush=True)
    return cells


def summary(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Medians over rounds per (concurrency, endpoint, mode): the gateway's figures and its added p50."""
    rows = []
    keys = sorted({(c["concurrency"], c["stream"], c["endpoint"]) for c in cells},
                  key=lambda k: (k[0], k[1], list(ENDPOINT_BODIES).index(k[2])))
    for conc, stream, name in keys:
        mine = [c for c in cells if (c["concurrency"], c["stream"], c["endpoint"]) == (conc, stream, name)]
        gw = {c["round"]: c for c in mine if c["target"] == "gateway"}
        direct = {c["round"]: c for c in mine if c["target"] == "direct"}
        added = [gw[r]["p50_ms"] - direct[r]["p50_ms"] for r in gw if r in direct]
        cpu = [c["cpu_ms_per_req"] for c in gw.values() if c["cpu_ms_per_req"] is not None]
        rows.append({"concurrency": conc, "stream": stream, "endpoint": name, "rounds": len(gw),
                     "direct_rps": statistics.median(c["rps"] for c in direct.values()),
                     "gateway_rps": statistics.median(c["rps"] for c in gw.values()),
                     "gateway_p50_ms": statistics.median(c["p50_ms"] for c in gw.values()),
                     "gateway_p99_ms": statistics.median(c["p99_ms"] for c in gw.values()),
                     "added_p50_ms": statistics.median(added) if added else None,
                     "cpu_ms_per_req": statistics.median(cpu) if cpu else None,
                     "errors": sum(c["errors"] for c in mine)})
    return rows


def _table(rows: list[dict[str, Any]]) -> str:
    lines = ["| c | mode | endpoint | direct req/s | gateway req/s | gateway p50 / p99 ms | added p50 ms | "
             "gateway CPU ms/req | errors |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['concurrency']} | {'SSE' if r['stream'] else 'JSON'} | {r['endpoint']} | "
                     f"{r['direct_rps']:,.0f} | {r['gateway_rps']:,.0f} | {r['gateway_p50_ms']:.2f} / "
                     f"{r['gateway_p99_ms']:.2f} | {r['added_p50_ms']:.2f} | {r['cpu_ms_per_req']:.3f} | "
                     f"{r['errors']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=5.0, help="seconds per wrk cell")
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16])
    p.add_argument("--wrk-threads", type=int, default=2)
    p.add_argument("--redis-url", default=os.environ.get("CASCADE_REDIS_URL", "redis://127.0.0.1:6379/0"))
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    prefix = f"bench:{uuid.uuid4().hex[:8]}:"
    with tempfile.TemporaryDirectory(prefix="cascade-endpoints-") as name:
        tmp = Path(name)
        procs = Procs(tmp)
        try:
            cells = run(args, tmp, procs, prefix)
        finally:
            procs.stop_all()
            cleanup_redis(args.redis_url, prefix)
    rows = summary(cells)
    print(_table(rows))
    out = args.out or RESULTS_DIR / f"overhead-endpoints-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "cells": cells, "summary": rows},
                              indent=1))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
