"""The access log's reader stalls: does the gateway notice? p99 at c=16 with stdout read, and with stdout piped
into a process that never reads it.

Setup: a zero-latency fake vLLM upstream (`loadtest.fake_upstream`) behind two remote pools, one gateway worker
(`--scorer none`, the real Redis ledger under a throw-away prefix per cell), `--access-log -` as an operator pipes
it: `cascade serve ... | cat > FILE` (`reading`: every line read) or `cascade serve ... | sleep` (`stalled`: the
pipe fills after ~200 lines and nobody ever empties it). `--old-cmd` adds `old-reading` and `old-stalled` (another
tree's `python -m gateway` in the same two set-ups: `env -C OLD_TREE PYTHONPATH=OLD_TREE .venv/bin/python -m
gateway`; `-m` puts the working directory first on the path). Each cell starts a fresh gateway, warms it up for
`--warmup` s, then runs wrk at c=16 for `--duration` s while a thread asks `/readyz` every 0.2 s (1 s timeout).

Per cell: requests/s, p50, p99, wrk's errors and timeouts, the `/readyz` answers (failed, slowest), the cost records
the ledger wrote to Redis while wrk ran (`cascade_ledger_records_total{outcome="recorded"}`, read before and after)
against the requests wrk saw answered (a request in flight when wrk stops is answered and recorded but not counted
by wrk: up to 16 more), all records against the lines the reader got, and `cascade_access_log_dropped_total`.
Variants are interleaved, their order flipped every round. Results go to
`loadtest/results/access-log-stall-<timestamp>.json`.

Run: `python -m loadtest.bench.access_log_stall` (about 2 minutes with the defaults; `--help`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from loadtest.bench.wrk import chat_body, lua_script, run_wrk
from loadtest.processes import (
    Env,
    Procs,
    cleanup_redis,
    free_port,
    gateway_command,
    http_get,
    policy_text,
    start_fake_upstream,
    wait_ready,
)

__all__ = ["build_parser", "main"]

RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"
_DROPPED = re.compile(r'^cascade_access_log_dropped_total\{reason="(\w+)"\} (\S+)$', re.MULTILINE)
_RECORDED = re.compile(r'^cascade_ledger_records_total\{outcome="recorded"\} (\S+)$', re.MULTILINE)


class ReadyProbe:
    """Asks `/readyz` every 0.2 s from a thread until `stop`: how many answered 200, how many did not, the slowest."""

    def __init__(self, base: str) -> None:
        self._base, self.ok, self.failed, self.slowest_ms = base, 0, 0, 0.0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(0.2):
            began = time.perf_counter()
            try:
                status = http_get(self._base + "/readyz", timeout_s=1.0)[0]
            except OSError:
                status = 0
            self.slowest_ms = max(self.slowest_ms, 1000 * (time.perf_counter() - began))
            self.ok, self.failed = (self.ok + 1, self.failed) if status == 200 else (self.ok, self.failed + 1)

    def stop(self) -> dict[str, Any]:
        self._done.set()
        self._thread.join(timeout=5)
        return {"readyz_ok": self.ok, "readyz_failed": self.failed, "readyz_slowest_ms": round(self.slowest_ms, 1)}


def _cell(env: Env, variant: str, upstream: str, lua: Path, rnd: int) -> dict[str, Any]:
    """Start the gateway of `variant` behind its reader, warm it up, measure it, stop it."""
    args, prefix = env.args, f"{env.prefix}{variant}:{rnd}:"
    policy = env.tmp / "policy.yaml"
    policy.write_text(policy_text(upstream, "fake-model", upstream, "fake-model"))
    port, lines = free_port(), env.tmp / f"{variant}-{rnd}.jsonl"
    old = variant.startswith("old")
    extra = ["--access-log", "-", *([] if old or args.buffer is None else ["--access-log-buffer", str(args.buffer)])]
    cmd, _ = gateway_command(policy, port, "h1", prefix, "WARNING", "redis", args.old_cmd if old else None,
                             extra=extra)
    reader = f"cat > {shlex.quote(str(lines))}" if variant.endswith("reading") else "exec sleep 100000"
    name = f"{variant}-{rnd}"
    proc = env.procs.start(name, ["sh", "-c", f"{shlex.join(cmd)} | {reader}"],
                           {"CASCADE_HOME": str(env.tmp / f"{name}-home"), "CASCADE_REDIS_URL": args.redis_url})
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base + "/readyz", proc, args.ready_timeout, f"gateway {name}", lambda: env.procs.log_tail(name))
        run_wrk(base + "/v1/chat/completions", lua, 16, args.warmup, args.wrk_threads, args.wrk_timeout)
        time.sleep(1.0)  # the warm-up's last records are written in the background
        before = _metrics(base)
        probe = ReadyProbe(base)
        res = run_wrk(base + "/v1/chat/completions", lua, 16, args.duration, args.wrk_threads, args.wrk_timeout)
        ready = probe.stop()
        time.sleep(1.0)
        metrics = _metrics(base)
    finally:
        env.procs.stop(name)
        cleanup_redis(args.redis_url, prefix)
    recorded = [float(m.group(1)) if (m := _RECORDED.search(text)) else None for text in (before, metrics)]
    records = None if None in recorded else int(recorded[1] - recorded[0])  # type: ignore[operator]
    dropped = {reason: float(v) for reason, v in _DROPPED.findall(metrics)}
    read = sum(1 for _ in lines.open("rb")) if lines.exists() else None
    total = None if recorded[1] is None else int(recorded[1])
    cell = {"round": rnd, "variant": variant, "rps": res.rps, "p50_ms": res.p50_ms, "p99_ms": res.p99_ms,
            "requests": res.requests, "non2xx": res.non2xx, "socket_errors": res.socket_errors,
            "timeouts": res.timeouts, "records_measured": records, "records_total": total, "lines_read": read,
            "dropped": dropped, "loadavg_1m": os.getloadavg()[0], **ready}
    print(f"  round {rnd} {variant:<12} {res.rps:7.0f} req/s  p50 {res.p50_ms:6.2f}  p99 {res.p99_ms:7.2f} ms  "
          f"errors {res.non2xx + res.socket_errors} timeouts {res.timeouts}  recorded {records} (wrk {res.requests}) "
          f"readyz ok {ready['readyz_ok']} failed {ready['readyz_failed']} slowest {ready['readyz_slowest_ms']} ms  "
          f"recorded in all {total}, lines read {read}, dropped {dropped}", flush=True)
    return cell


def _metrics(base: str) -> str:
    """The gateway's /metrics text; "" from a gateway its log holds (the old tree's stalled cell answers nothing)."""
    try:
        return http_get(base + "/metrics", timeout_s=5)[1].decode()
    except OSError:
        return ""


def summarise(cells: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Medians per variant over the rounds."""
    out: dict[str, dict[str, float]] = {}
    for variant in dict.fromkeys(c["variant"] for c in cells):
        mine = [c for c in cells if c["variant"] == variant]
        out[variant] = {k: statistics.median(c[k] for c in mine) for k in ("rps", "p50_ms", "p99_ms")}
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.access_log_stall", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--old-cmd", help="another tree's launcher taking `serve ...` (adds old-reading, old-stalled)")
    p.add_argument("--buffer", type=int, help="this tree's --access-log-buffer (default: its default, 10,000 "
                   "lines); smaller, the stalled cell spends more of its time dropping lines")
    p.add_argument("--duration", type=float, default=10.0, help="seconds per cell (default 10)")
    p.add_argument("--warmup", type=float, default=3.0, help="warm-up seconds per cell (default 3)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--wrk-threads", type=int, default=1, help="wrk threads (default 1)")
    p.add_argument("--wrk-timeout", type=float, default=5.0, help="wrk per-request timeout in s (default 5)")
    p.add_argument("--redis-url", default=os.environ.get("CASCADE_REDIS_URL", "redis://127.0.0.1:6379/0"))
    p.add_argument("--ready-timeout", type=float, default=120, help="seconds a gateway may take to start")
    p.add_argument("--out", type=Path, help="JSON path (default loadtest/results/access-log-stall-<ts>.json)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    variants = ["reading", "stalled", *(["old-reading", "old-stalled"] if args.old_cmd else [])]
    with tempfile.TemporaryDirectory(prefix="access-log-stall-") as tmp_name:
        env = Env(args, Path(tmp_name), Procs(Path(tmp_name)), f"bench:als:{uuid.uuid4().hex[:8]}:")
        cells: list[dict[str, Any]] = []
        try:
            upstream, _ = start_fake_upstream(env, "fake-upstream")
            lua = env.tmp / "chat.lua"
            lua.write_text(lua_script(chat_body()))
            for rnd in range(args.rounds):
                for variant in variants if rnd % 2 == 0 else variants[::-1]:
                    cells.append(_cell(env, variant, upstream, lua, rnd))
        finally:
            env.procs.stop_all()
    summary = summarise(cells)
    for variant, figures in summary.items():
        print(f"{variant:<12} median {figures['rps']:7.0f} req/s  p50 {figures['p50_ms']:6.2f}  "
              f"p99 {figures['p99_ms']:7.2f} ms")
    out = args.out or RESULTS_DIR / f"access-log-stall-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"cells": cells, "summary": summary}, indent=1))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
