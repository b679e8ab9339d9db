"""What a CPU engine's start costs, by how vLLM starts its processes: forked (the project's plugin) or spawned.

vLLM starts an engine's engine core and model worker with Python's `multiprocessing`; on CPU it always spawns them
(a fresh interpreter each, importing torch and vLLM again); the project's vLLM plugin forks them instead
(`backends/engines/vllm_start.py`, `CASCADE_VLLM_START_METHOD`). For each method (`--methods`) and round, one engine
(the demo micro model unless `--model`, rendered by `backends.engines.args` as the supervisor renders it) is started
from nothing: the wall time from its command to `/health` answering 200, the CPU every process of its group used by
then (from /proc, by process), and its answer to one greedy request (the methods must answer alike). Methods
interleave and their order flips each round. Medians and the ratio are printed at the end.

`python -m loadtest.bench.engine_start` (about 3 minutes with the defaults on 2 cores; run it under
`flock /tmp/cascade-engines.lock` where other engines may run, on an otherwise quiet host).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from backends.engines.vllm_start import START_METHOD_ENV
from loadtest.processes import demo_engine_spec, engine_process, group_cpu
from policies.schema import EngineSpec

__all__ = ["Start", "main"]


@dataclass(frozen=True)
class Start:
    method: str
    wall_s: float
    cpu: dict[str, float]  # process name -> CPU seconds at ready
    answer: str

    @property
    def cpu_s(self) -> float:
        return sum(self.cpu.values())


def _start(spec: EngineSpec, method: str, log: Path) -> Start:
    """One engine started with `method`, measured at ready, asked once, stopped."""
    started = time.monotonic()
    with engine_process(spec, {START_METHOD_ENV: method}, log, f"engine ({method})") as (url, pgid):
        wall, cpu = time.monotonic() - started, group_cpu(pgid)
        body = {"model": spec.served_name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
                "temperature": 0}
        answer = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
        answer.raise_for_status()
        return Start(method, wall, cpu, answer.json()["choices"][0]["message"]["content"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.engine_start", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", default="fork,spawn",
                   help=f"settings of {START_METHOD_ENV} to compare (fork, spawn, vllm; default fork,spawn)")
    p.add_argument("--rounds", type=int, default=2, help="rounds over the methods (default 2)")
    p.add_argument("--model", default="demo:micro", help="the engine's model (default demo:micro)")
    args = p.parse_args(argv)
    spec = demo_engine_spec(args.model)
    methods = args.methods.split(",")
    log = Path(os.environ.get("TMPDIR", "/tmp")) / "engine-start.log"
    starts: list[Start] = []
    for round_ in range(args.rounds):
        for method in methods if round_ % 2 == 0 else methods[::-1]:
            print(f"round {round_ + 1}: starting an engine with {START_METHOD_ENV}={method} (log {log})", flush=True)
            starts.append(_start(spec, method, log))
            s = starts[-1]
            print(f"  ready after {s.wall_s:.1f} s, {s.cpu_s:.1f} CPU s "
                  f"({', '.join(f'{k} {v:.1f}' for k, v in sorted(s.cpu.items()))}); answer {s.answer!r}", flush=True)
    print("\n| method | starts | wall to ready, s (median) | CPU s (median) | answers |")
    print("|---|---|---|---|---|")
    medians = {}
    for method in methods:
        mine = [s for s in starts if s.method == method]
        medians[method] = (statistics.median(s.wall_s for s in mine), statistics.median(s.cpu_s for s in mine))
        print(f"| {method} | {len(mine)} | {medians[method][0]:.1f} | {medians[method][1]:.1f} | "
              f"{len({s.answer for s in mine})} distinct |")
    print(f"answers alike across methods: {len({s.answer for s in starts}) == 1}")
    if len(methods) > 1:
        first, last = medians[methods[0]], medians[methods[-1]]
        print(f"{methods[0]} / {methods[-1]}: wall x{first[0] / last[0]:.2f}, CPU x{first[1] / last[1]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
