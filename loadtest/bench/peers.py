"""Side by side in one run: an engine called directly, through the cascade gateway, and through LiteLLM's
proxy (a peer gateway), all driven by the same load generator with the same prompts, interleaved.

LiteLLM is never a dependency of this project: it runs from a throw-away venv (`--litellm-venv`, made with
`python -m venv /tmp/litellm-venv && /tmp/litellm-venv/bin/pip install 'litellm[proxy]==1.108.7'`), one
worker, in front of the same engine (`hosted_vllm/` provider). Run `python -m loadtest.bench.peers --help`.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest.load.generator import LoadConfig, TenantKey, run_load
from loadtest.load.phases import Phase
from loadtest.load.prompt_mix import parse_mix
from loadtest.processes import Procs, free_port, wait_ready

__all__ = ["PeerTarget", "build_parser", "format_side_by_side", "main", "side_by_side", "start_litellm"]


@dataclass(frozen=True, slots=True)
class PeerTarget:
    name: str
    url: str
    model: str
    api_key: str | None = None


def start_litellm(procs: Procs, venv: Path, engine_url: str, engine_model: str, work: Path,
                  timeout_s: float = 180.0) -> PeerTarget:
    """Start LiteLLM's proxy from `venv` in front of `engine_url` (an OpenAI-compatible vLLM); returns its target
    (model name: `engine_model`; key: a fresh master key). Raises RuntimeError with the log tail if it fails."""
    exe = venv / "bin" / "litellm"
    if not exe.exists():
        raise RuntimeError(f"{exe} not found: python -m venv {venv} && {venv}/bin/pip install 'litellm[proxy]'")
    config = work / "litellm.yaml"
    config.write_text(f"""model_list:
  - model_name: {engine_model}
    litellm_params:
      model: hosted_vllm/{engine_model}
      api_base: {engine_url.rstrip('/')}/v1
      api_key: none
""")
    key = "sk-peer-" + secrets.token_hex(20)
    port = free_port()
    proc = procs.start("litellm", [str(exe), "--config", str(config), "--port", str(port), "--num_workers", "1"],
                       {"LITELLM_MASTER_KEY": key, "LITELLM_LOG": "ERROR"})
    base = f"http://127.0.0.1:{port}"
    wait_ready(base + "/health/liveliness", proc, timeout_s, "litellm", lambda: procs.log_tail("litellm"))
    return PeerTarget("litellm", base, engine_model, key)


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 2) if present else None


async def side_by_side(targets: list[PeerTarget], concurrency: int, duration_s: float, rounds: int,
                       max_tokens: int = 32, mix: str = "short-easy:1", seed: int = 0) -> dict[str, Any]:
    """Closed-loop runs of every target per round (order rotated each round); medians over rounds. The first
    target is the reference: `ratio_median` is the median over rounds of tokens/s divided by its tokens/s in
    the same round (pairing within a round cancels some of a shared machine's drift)."""
    cells: list[dict[str, Any]] = []
    for rnd in range(rounds):
        order = targets[rnd % len(targets):] + targets[:rnd % len(targets)]
        for t in order:
            config = LoadConfig(base_url=t.url, model=t.model, phases=[Phase("run", duration_s, concurrency,
                                                                              concurrency)],
                                mode="closed", mix=parse_mix(mix), max_tokens=max_tokens, seed=seed + rnd,
                                tenants=[TenantKey(t.name, t.api_key)], progress=False, label=f"peer-{t.name}")
            s = (await run_load(config)).summary()["overall"]
            cell = {"round": rnd, "target": t.name, "ok": s["ok"], "errors": s["sent"] - s["ok"],
                    "rps": s["throughput_rps"], "tokens_per_s": s["tokens_per_s"], "ttft_ms": s["ttft_ms"],
                    "itl_ms": s["itl_ms"], "e2e_ms": s["e2e_ms"], "error_examples": s["error_examples"]}
            print(f"  round {rnd} {t.name:<9} {s['tokens_per_s'] or 0:7.0f} tok/s  {s['throughput_rps'] or 0:6.2f} "
                  f"req/s  TTFT p50 {s['ttft_ms']['p50']} p99 {s['ttft_ms']['p99']} ms  errors "
                  f"{s['sent'] - s['ok']}", flush=True)
            cells.append(cell)
    direct = {c["round"]: c["tokens_per_s"] for c in cells if c["target"] == targets[0].name}
    rows = []
    for t in targets:
        mine = [c for c in cells if c["target"] == t.name]
        paired = [c["tokens_per_s"] / direct[c["round"]] for c in mine if c["tokens_per_s"] and direct.get(c["round"])]
        rows.append({"target": t.name, "rounds": len(mine), "tokens_per_s": _median([c["tokens_per_s"] for c in mine]),
                     "rps": _median([c["rps"] for c in mine]),
                     **{f"{k}_{q}_ms": _median([c[f"{k}_ms"][q] for c in mine]) for k in ("ttft", "itl", "e2e")
                        for q in ("p50", "p99")},
                     "errors": sum(c["errors"] for c in mine),
                     "ratio_rounds": [round(r, 3) for r in paired], "ratio_median": _median(paired)})
    return {"concurrency": concurrency, "duration_s": duration_s, "rounds": rounds, "max_tokens": max_tokens,
            "cells": cells, "rows": rows}


def format_side_by_side(result: dict[str, Any]) -> str:
    rows = result["rows"]
    lines = [f"{'target':<10}{'tok/s':>8}{'x ref':>9}{'TTFT p50':>10}{'TTFT p99':>10}{'ITL p50':>9}"
             f"{'ITL p99':>9}{'e2e p50':>9}{'errors':>7}  per-round ratios"]
    for r in rows:
        ratio = r["ratio_median"]
        lines.append(f"{r['target']:<10}{r['tokens_per_s'] or 0:>8.0f}{'-' if ratio is None else f'{ratio:.3f}':>9}"
                     f"{r['ttft_p50_ms'] or 0:>10.1f}{r['ttft_p99_ms'] or 0:>10.1f}{r['itl_p50_ms'] or 0:>9.1f}"
                     f"{r['itl_p99_ms'] or 0:>9.1f}{r['e2e_p50_ms'] or 0:>9.1f}{r['errors']:>7}  {r['ratio_rounds']}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.peers", description=__doc__.split("\n\n")[0]
                                if __doc__ else None, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--engine-url", required=True, help="the engine's base URL (called directly and behind both)")
    p.add_argument("--engine-model", default="micro", help="the engine's served model name")
    p.add_argument("--gateway-url", help="a running cascade gateway in front of that engine")
    p.add_argument("--gateway-model", default="micro", help="model name that pins the engine's pool")
    p.add_argument("--gateway-key", help="API key for the gateway (when its policy has tenants)")
    p.add_argument("--litellm-venv", type=Path, default=Path("/tmp/litellm-venv"),
                   help="venv with litellm[proxy] (skipped with a note when missing)")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--duration", type=float, default=15.0, help="seconds per cell")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=32)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    targets = [PeerTarget("direct", args.engine_url, args.engine_model)]
    if args.gateway_url:
        targets.append(PeerTarget("gateway", args.gateway_url, args.gateway_model, args.gateway_key))
    with tempfile.TemporaryDirectory(prefix="peer-bench-") as tmp:
        procs = Procs(Path(tmp))
        try:
            try:
                targets.append(start_litellm(procs, args.litellm_venv, args.engine_url, args.engine_model,
                                             Path(tmp)))
            except RuntimeError as exc:
                print(f"LiteLLM skipped: {exc}")
            result = asyncio.run(side_by_side(targets, args.concurrency, args.duration, args.rounds,
                                              args.max_tokens))
        finally:
            procs.stop_all()
    print(format_side_by_side(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
