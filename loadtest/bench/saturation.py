"""Check `cascade plan`'s capacity model against a real engine: predicted vs measured saturation point.

1. Start one demo engine (the tiny micro model on vLLM) with its batch capped (`--max-num-seqs`), the batch
   whose ITL the SLO allows; or use `--url` for an engine already running.
2. Calibrate `Capacity` from closed-loop runs at that concurrency (the replica is always full, so
   replica-seconds per request = wall time / completed requests): short prompt + 1 token, long prompt + 1
   token, short prompt + many tokens, and the representative mix; a least-squares fit gives request overhead,
   prefill and decode rates (non-negative). (The fit from the first three alone is reported too: `..._from_corners`.)
3. Measure the model's TTFT scale T0 from one light open-loop step (utilization 0.3: T0 = p95 TTFT x 0.7).
4. Predict the open-loop saturation point of the mix with `gateway.planning.model.saturation_rps`: the load at
   which p95 TTFT = T0 / (1 - rho) reaches the SLO (capped by throughput).
5. Measure it: open-loop Poisson arrivals at rising rates around the prediction, `step_s` seconds each;
   a step passes while p95 TTFT stays within the SLO (and under 1% fail): past saturation requests queue, and
   the queue grows through the step. The measured saturation point is the highest passing rate.

The calibrated prefill and decode rates are what a GPU-hour price divides by (`policies.money`): with
`--gpu-hour-usd` the result carries the pool's `price:` block to paste into the policy (`price_block`), and
`--price-only` stops after the calibration (steps 1-2).

`python -m loadtest.bench.saturation --out sat.json` (run real engines under `flock /tmp/cascade-engines.lock`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from gateway.planning.model import mean_service_s, saturation_rps
from gateway.planning.schema import Capacity, Slo, TokenClass
from loadtest.load.connections import connector
from loadtest.load.stream_client import StreamSample, percentile, scan_sse_line, stream_body
from policies.money import Price, usd_to_micro

__all__ = ["FACTORS", "Step", "Workload", "calibrate", "main", "measure_knee", "price_block", "run"]

_WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "seven", "small", "robots",
          "count", "red", "apples", "in", "the", "garden", "near", "an", "old", "stone", "bridge")


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    words: int
    max_tokens: int

    def prompt(self) -> str:
        return " ".join(_WORDS[i % len(_WORDS)] for i in range(self.words))


@dataclass(frozen=True, slots=True)
class Step:
    offered_rps: float
    sent: int
    finished_in_step: int
    ttft_p95_s: float | None
    errors: int
    passed: bool
    error_kinds: tuple[str, ...] = ()


SHORT, LONG, DECODE = Workload("short", 8, 1), Workload("long", 380, 1), Workload("decode", 8, 128)
MIXED = Workload("mixed", 200, 48)


async def _stream(session: aiohttp.ClientSession, url: str, body: bytes) -> tuple[StreamSample, float]:
    sample, started = StreamSample(), time.monotonic()
    try:
        async with session.post(url, data=body, headers={"content-type": "application/json"}) as resp:
            if resp.status != 200:
                sample.error = f"HTTP {resp.status}"
            else:
                async for raw in resp.content:
                    if scan_sse_line(raw.rstrip(b"\r\n"), sample, started):
                        break
    except (aiohttp.ClientError, TimeoutError) as exc:
        sample.error = type(exc).__name__
    return sample, time.monotonic()


async def _tokens(session: aiohttp.ClientSession, base: str, model: str, w: Workload) -> TokenClass:
    """The workload's real prompt and output token counts, from one non-streamed request's usage."""
    body = {"model": model, "messages": [{"role": "user", "content": w.prompt()}], "max_tokens": w.max_tokens,
            "ignore_eos": True, "temperature": 0.0}
    async with session.post(base + "/v1/chat/completions", json=body) as resp:
        answer = await resp.json()
    if "usage" not in answer:
        raise RuntimeError(f"workload {w.name}: the engine answered {str(answer)[:300]}")
    usage = answer["usage"]
    return TokenClass(share=1.0, prompt_tokens=usage["prompt_tokens"], output_tokens=usage["completion_tokens"])


async def _closed_loop(session: aiohttp.ClientSession, url: str, body: bytes, concurrency: int,
                       duration_s: float) -> float:
    """Replica-seconds per request with `concurrency` clients keeping the engine full."""
    done = 0
    started = time.monotonic()
    deadline = started + duration_s

    async def worker() -> None:
        nonlocal done
        while time.monotonic() < deadline:
            sample, _ = await _stream(session, url, body)
            done += sample.error is None
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return (time.monotonic() - started) / max(done, 1)


def _fit(rows: list[list[float]], seconds: list[float]) -> Capacity:
    """Non-negative least squares on relative errors (each row divided by its own replica-seconds), so a
    noisy long workload cannot push the short ones' overhead below zero."""
    from scipy.optimize import nnls

    weights = 1 / np.array(seconds)
    (c0, inv_p, inv_d), _ = nnls(np.array(rows) * weights[:, None], np.array(seconds) * weights)
    return Capacity(request_overhead_s=float(c0), prefill_tokens_per_s=1 / max(float(inv_p), 1e-9),
                    decode_tokens_per_s=1 / max(float(inv_d), 1e-9))


async def calibrate(session: aiohttp.ClientSession, base: str, model: str, batch: int,
                    duration_s: float) -> tuple[Capacity, Capacity, dict[str, Any]]:
    """Fit s = c0 + p/P + o/D by least squares: from the three corner workloads alone, and from those plus
    the representative mix (what ops measure: "throughput at representative load"). Returns both fits."""
    url, rows, seconds, notes = base + "/v1/chat/completions", [], [], {}
    for w in (SHORT, LONG, DECODE, MIXED):
        t = await _tokens(session, base, model, w)
        s = await _closed_loop(session, url, stream_body(model, w.max_tokens, w.prompt()), batch, duration_s)
        rows.append([1.0, t.prompt_tokens, t.output_tokens])
        seconds.append(s)
        notes[w.name] = {"prompt_tokens": t.prompt_tokens, "output_tokens": t.output_tokens, "replica_s": s}
    return _fit(rows[:3], seconds[:3]), _fit(rows, seconds), notes


async def _open_loop_step(session: aiohttp.ClientSession, url: str, body: bytes, rps: float, step_s: float,
                          slo: Slo, rng: random.Random) -> Step:
    tasks: list[asyncio.Task[tuple[StreamSample, float]]] = []
    started = time.monotonic()
    end, at = started + step_s, started
    while (at := at + rng.expovariate(rps)) < end:
        await asyncio.sleep(max(0.0, at - time.monotonic()))
        tasks.append(asyncio.create_task(_stream(session, url, body)))
    results = await asyncio.gather(*tasks)
    good = [(s, t) for s, t in results if s.error is None]
    ttft = percentile([s.ttft_s for s, _ in good if s.ttft_s is not None], 95)
    in_step = sum(1 for _, t in good if t <= end)
    # past saturation the queue, hence TTFT, grows by about (rho - 1) seconds per second of the step
    errors = len(results) - len(good)
    passed = ttft is not None and ttft <= slo.ttft_s and errors <= 0.01 * len(results)
    kinds = tuple(sorted({s.error for s, _ in results if s.error is not None}))
    return Step(rps, len(tasks), in_step, ttft, errors, passed, kinds)


async def measure_knee(session: aiohttp.ClientSession, base: str, model: str, around_rps: float, slo: Slo,
                       step_s: float, factors: tuple[float, ...]) -> tuple[float | None, list[Step]]:
    """Highest passing offered rate of `MIXED` among `around_rps x factors` (stops after two failures)."""
    url, rng = base + "/v1/chat/completions", random.Random(7)
    body = stream_body(model, MIXED.max_tokens, MIXED.prompt())
    steps: list[Step] = []
    for f in factors:
        steps.append(await _open_loop_step(session, url, body, around_rps * f, step_s, slo, rng))
        print(f"  {steps[-1]}", file=sys.stderr, flush=True)
        if len(steps) >= 2 and not steps[-1].passed and not steps[-2].passed:
            break
    passing = [s.offered_rps for s in steps if s.passed]
    return (max(passing) if passing else None), steps


async def _idle_ttft(session: aiohttp.ClientSession, base: str, model: str, cap: Capacity, mixed: TokenClass,
                     slo: Slo, step_s: float, rho: float = 0.3, tries: int = 2) -> Capacity:
    """T0 of the model: p95 TTFT of an open-loop step at utilization `rho`, times (1 - rho); the lowest of `tries`
    steps, since a stall of the host (not the engine) only ever raises a p95 (one put a fake engine's 10 ms at
    1.3 s in a loaded suite)."""
    rps = rho / mean_service_s(cap, [mixed])
    body = stream_body(model, MIXED.max_tokens, MIXED.prompt())
    p95s = []
    for seed in range(3, 3 + tries):
        step = await _open_loop_step(session, base + "/v1/chat/completions", body, rps, step_s, slo,
                                     random.Random(seed))
        if step.ttft_p95_s is None:
            raise RuntimeError(f"no request succeeded at {rps:.1f} requests/s: {step}")
        p95s.append(step.ttft_p95_s)
    return cap.model_copy(update={"ttft_p95_idle_s": min(p95s) * (1 - rho)})


FACTORS = (0.5, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.35, 1.5, 1.7)


def _three_figures(rate: float) -> str:
    """A rate as YAML reads a number: 23874.3 -> "23900", 12.74 -> "12.7" (never an exponent, which YAML 1.1
    would read as a string)."""
    value = float(f"{rate:.3g}")
    return str(int(value)) if value >= 100 else f"{value:.3g}"


def price_block(cap: Capacity, gpu_hour_usd: str) -> str:
    """The policy `price:` line for one replica costing `gpu_hour_usd` per hour at the calibrated rates (to 3
    significant figures: the calibration is no more precise), checked to load as a `Price`. Raises ValueError
    for a price the policy would refuse."""
    prefill, decode = (_three_figures(rate) for rate in (cap.prefill_tokens_per_s, cap.decode_tokens_per_s))
    Price.model_validate({"gpu_hour_usd": gpu_hour_usd, "prefill_tokens_per_second": prefill,
                          "decode_tokens_per_second": decode})
    return (f'price: {{gpu_hour_usd: "{gpu_hour_usd}", prefill_tokens_per_second: {prefill}, '
            f"decode_tokens_per_second: {decode}}}")


async def run(base: str, model: str, batch: int, slo: Slo, calib_s: float, step_s: float,
              factors: tuple[float, ...] = FACTORS, gpu_hour_usd: str | None = None,
              price_only: bool = False) -> dict[str, Any]:
    """Calibrate, predict, measure; the JSON-ready result (predicted vs measured req/s, relative error), with
    the policy's `price_block` when `gpu_hour_usd` is given. `price_only`: the calibration and the price alone."""
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(connector=connector(1024), timeout=timeout) as session:
        corners, cap, notes = await calibrate(session, base, model, batch, calib_s)
        price = None if gpu_hour_usd is None else price_block(cap, gpu_hour_usd)
        if price is not None:
            print(f"{price}  # one replica at batch {batch}, calibrated by loadtest.bench.saturation", file=sys.stderr)
        if price_only:
            return {"capacity": cap.model_dump(), "calibration": notes, "batch": batch, "price_block": price}
        mixed = await _tokens(session, base, model, MIXED)
        cap = await _idle_ttft(session, base, model, cap, mixed, slo, step_s)
        predicted = saturation_rps(cap, [mixed], slo)
        print(f"capacity {cap}; mixed {mixed}; predicted saturation {predicted:.2f} req/s", file=sys.stderr)
        measured, steps = await measure_knee(session, base, model, predicted, slo, step_s, factors)
    error = None if measured is None else (predicted - measured) / measured
    unseen = saturation_rps(corners.model_copy(update={"ttft_p95_idle_s": cap.ttft_p95_idle_s}), [mixed], slo)
    return {"capacity": cap.model_dump(), "capacity_from_corners": corners.model_dump(), "calibration": notes,
            "mixed": mixed.model_dump(), "batch": batch, "slo": slo.model_dump(), "predicted_rps": predicted,
            "predicted_rps_from_corners": unseen, "measured_rps": measured, "relative_error": error,
            "within_25_percent": error is not None and abs(error) <= 0.25, "steps": [asdict(s) for s in steps],
            "price_block": price}


async def _with_engine(args: argparse.Namespace, slo: Slo) -> dict[str, Any]:
    from backends.engines.supervisor import EngineSupervisor
    from policies.schema import EngineSpec

    spec = EngineSpec(model="demo:micro", served_name="micro", max_model_len=1024, dtype="bfloat16",
                      kv_cache_space_gib=1, base_port=8151,
                      extra_args=("--enforce-eager", "--max-num-seqs", str(args.batch)))
    async with EngineSupervisor("saturation", spec) as sup:
        return await run(sup.urls[0], "micro", args.batch, slo, args.calibrate_s, args.step_s,
                         gpu_hour_usd=args.gpu_hour_usd, price_only=args.price_only)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.saturation", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="an engine already running (default: start the demo micro engine)")
    p.add_argument("--model", default="micro", help="served model name with --url")
    p.add_argument("--batch", type=int, default=16, help="--max-num-seqs of the started engine / calibration "
                   "concurrency (default: %(default)s)")
    p.add_argument("--ttft-slo-s", type=float, default=1.0)
    p.add_argument("--itl-slo-s", type=float, default=0.1)
    p.add_argument("--calibrate-s", type=float, default=10.0, help="seconds per calibration run")
    p.add_argument("--step-s", type=float, default=15.0, help="seconds per open-loop rate step")
    p.add_argument("--out", type=Path, help="write the JSON result here too")
    p.add_argument("--gpu-hour-usd", help="what one replica's GPUs cost per hour, e.g. 2.50: prints the policy's "
                   "price block at the calibrated prefill and decode rates")
    p.add_argument("--price-only", action="store_true", help="calibrate and print the price; no saturation ramp")
    args = p.parse_args(argv)
    if args.gpu_hour_usd is not None:
        try:
            usd_to_micro(args.gpu_hour_usd)
        except ValueError as exc:
            p.error(f"--gpu-hour-usd: {exc}")
    slo = Slo(ttft_s=args.ttft_slo_s, itl_s=args.itl_slo_s)
    if args.url:
        result = asyncio.run(run(args.url.rstrip("/"), args.model, args.batch, slo, args.calibrate_s, args.step_s,
                                 gpu_hour_usd=args.gpu_hour_usd, price_only=args.price_only))
    else:
        result = asyncio.run(_with_engine(args, slo))
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0 if args.price_only or result["within_25_percent"] else 1


if __name__ == "__main__":
    sys.exit(main())
