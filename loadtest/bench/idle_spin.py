"""What a CPU engine's idle spin costs: one demo engine, its processes' CPU at light traffic, per spin setting.

A vLLM model worker busy-polls its input queue for `busy_loop_s` after each message (1 s in vLLM 0.32);
`backends/engines/vllm_plugin.py` caps that on CPU engines (`CASCADE_VLLM_IDLE_SPIN_S`). For each setting
(`--spins`, `vllm` = vLLM's own) one engine (the demo micro model unless `--model`, as `backends.engines.args`
renders it) is started, then for each gap (`--gaps`) a client sends one short chat request (8 tokens), waits the
gap, and so on for `--seconds`; the CPU each process used over that time (from /proc, as a share of one core) and
the requests' median latency are printed for each setting, side by side. Then the engine busy (what the cap must not
slow): `--busy` concurrent requests of 128 tokens each, back to back for `--seconds`, and its completion tokens/s.
Settings interleave over `--rounds`.

`python -m loadtest.bench.idle_spin` (about 3 minutes with the defaults; run it under
`flock /tmp/cascade-engines.lock` where other engines may run).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from backends.engines.vllm_plugin import IDLE_SPIN_ENV
from loadtest.processes import demo_engine_spec, engine_process, group_cpu

__all__ = ["Cell", "main"]


@dataclass(frozen=True)
class Cell:
    spin: str
    gap_s: float
    requests: int
    cpu: dict[str, float]  # process name -> share of one core
    p50_ms: float
    tokens_per_s: float = 0.0


def _shares(before: dict[str, float], after: dict[str, float], wall: float) -> dict[str, float]:
    """Each process's CPU between the two readings, as a share of one core."""
    return {name: round((after[name] - before.get(name, 0.0)) / wall, 3) for name in after}


def _cell(url: str, pgid: int, spin: str, gap_s: float, seconds: float) -> Cell:
    body = {"model": "micro", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    latencies = []
    with httpx.Client(timeout=60) as client:
        client.post(url + "/v1/chat/completions", json=body).raise_for_status()  # warm
        time.sleep(2)
        before, started = group_cpu(pgid), time.monotonic()
        while time.monotonic() - started < seconds:
            sent = time.monotonic()
            client.post(url + "/v1/chat/completions", json=body).raise_for_status()
            latencies.append(time.monotonic() - sent)
            time.sleep(gap_s)
        after, wall = group_cpu(pgid), time.monotonic() - started
    return Cell(spin, gap_s, len(latencies), _shares(before, after, wall), statistics.median(latencies) * 1000)


async def _busy(url: str, concurrency: int, seconds: float) -> tuple[int, float]:
    """Completion tokens written by `concurrency` clients sending 128-token requests back to back, and the time."""
    body = {"model": "micro", "messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 128,
            "ignore_eos": True}
    tokens = 0
    started = time.monotonic()

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal tokens
        while time.monotonic() - started < seconds:
            answer = await http.post(url + "/v1/chat/completions", json=body)
            answer.raise_for_status()
            tokens += answer.json()["usage"]["completion_tokens"]

    async with httpx.AsyncClient(timeout=120) as http:
        await asyncio.gather(*(client(http) for _ in range(concurrency)))
    return tokens, time.monotonic() - started


def _busy_cell(url: str, pgid: int, spin: str, concurrency: int, seconds: float) -> Cell:
    before = group_cpu(pgid)
    tokens, wall = asyncio.run(_busy(url, concurrency, seconds))
    return Cell(spin, 0.0, concurrency, _shares(before, group_cpu(pgid), wall), 0.0, tokens / wall)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.idle_spin", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spins", default="vllm,0.02", help="settings of CASCADE_VLLM_IDLE_SPIN_S (default vllm,0.02)")
    p.add_argument("--gaps", default="0.5,2", help="seconds between a request's answer and the next (default 0.5,2)")
    p.add_argument("--seconds", type=float, default=20.0, help="traffic per cell (default 20)")
    p.add_argument("--busy", type=int, default=8, help="concurrent requests of the busy cell (default 8; 0: none)")
    p.add_argument("--rounds", type=int, default=1, help="rounds over the settings (default 1)")
    p.add_argument("--model", default="demo:micro", help="the engine's model (default demo:micro)")
    args = p.parse_args(argv)
    spec = demo_engine_spec(args.model)
    spins, gaps = args.spins.split(","), [float(g) for g in args.gaps.split(",")]
    log = Path(os.environ.get("TMPDIR", "/tmp")) / "idle-spin-engine.log"
    cells: list[Cell] = []
    for round_ in range(args.rounds):
        for spin in spins if round_ % 2 == 0 else spins[::-1]:
            print(f"round {round_ + 1}: starting an engine with {IDLE_SPIN_ENV}={spin} (log {log})", flush=True)
            with engine_process(spec, {IDLE_SPIN_ENV: spin}, log, f"engine (spin {spin})") as (url, pgid):
                for gap in gaps:
                    cells.append(_cell(url, pgid, spin, gap, args.seconds))
                    print(f"  {cells[-1]}", flush=True)
                if args.busy:
                    cells.append(_busy_cell(url, pgid, spin, args.busy, args.seconds))
                    print(f"  {cells[-1]}", flush=True)
    print("\n| spin | traffic | worker (cores) | engine core | API server | p50 ms | tokens/s |")
    print("|---|---|---|---|---|---|---|")
    for c in cells:
        traffic = f"{c.requests} requests, {c.gap_s:g} s apart" if c.gap_s else f"{c.requests} at once, busy"
        print(f"| {c.spin} | {traffic} | {c.cpu.get('VLLM::Worker', 0):.2f} | {c.cpu.get('VLLM::EngineCor', 0):.2f} | "
              f"{c.cpu.get('API server', 0):.2f} | {c.p50_ms:.1f} | {c.tokens_per_s:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
