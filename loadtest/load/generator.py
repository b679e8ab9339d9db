"""Async load generator for any OpenAI-compatible endpoint: the gateway (model `auto` or a pinned pool),
a vLLM engine directly, or another proxy, so every figure can be compared side by side in one run.

Modes: open loop, Poisson arrivals at a rate per phase (ramps allowed); closed loop, N clients each
sending one request after the other. Each request is drawn from a short/long x easy/hard prompt mix,
optionally under one of several tenants' API keys (to exercise priority shedding). Streaming requests
measure TTFT and inter-token latency. A live progress line goes to stderr; the summary (throughput,
TTFT / ITL / e2e p50/p95/p99, errors by class with 429 and Retry-After apart, per-pool share, per
phase) to stdout; JSON and a PNG plot to `loadtest/results/`. Run `python -m loadtest.load --help`.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import aiohttp
import orjson

from loadtest.load.client import RequestSpec, Sample, send_one
from loadtest.load.connections import connector
from loadtest.load.metrics import LadderWatch
from loadtest.load.phases import Phase, parse_phases
from loadtest.load.plots import plot_run
from loadtest.load.prompt_mix import DEFAULT_MIX, PromptMix, parse_mix
from loadtest.load.stats import per_second, status_class, summarise

__all__ = ["RESULTS_DIR", "LoadConfig", "LoadRun", "TenantKey", "build_parser", "config_from_args", "format_summary",
           "main", "run_load", "write_results"]

RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"


@dataclass(frozen=True, slots=True)
class TenantKey:
    name: str
    api_key: str | None
    weight: float = 1.0


@dataclass(frozen=True)
class LoadConfig:
    """One run. `phases` levels are requests/s (open) or concurrency (closed)."""

    base_url: str
    model: str
    phases: list[Phase]
    mode: Literal["open", "closed"] = "open"
    mix: dict[str, float] = field(default_factory=lambda: parse_mix(DEFAULT_MIX))
    tenants: list[TenantKey] = field(default_factory=lambda: [TenantKey("default", None)])
    max_tokens: int = 32
    stream: bool = True
    ignore_eos: bool = True
    seed: int = 0
    timeout_s: float = 120.0
    metrics_url: str | None = None
    metrics_interval_s: float = 1.0
    max_in_flight: int = 2000
    progress: bool = True
    label: str = "load"
    answering: Counter[str] | None = None  # streams being answered now, per pool (`client.send_one`), kept live

    @property
    def chat_url(self) -> str:
        base = self.base_url.rstrip("/")
        return base + ("/chat/completions" if base.endswith("/v1") else "/v1/chat/completions")


@dataclass
class LoadRun:
    """What a run produced: samples, figures, ladder timeline (if `/metrics` was watched)."""

    config: LoadConfig
    samples: list[Sample]
    wall_s: float
    phase_spans: list[tuple[str, float, float]]
    ladder: LadderWatch | None
    skipped: int = 0  # arrivals not sent because `max_in_flight` requests were already open
    t0: float = 0.0  # `time.monotonic()` when the run began: its samples' `sent_s` count from it

    def summary(self) -> dict[str, Any]:
        overall = summarise(self.samples, self.wall_s)
        phases = {name: summarise([s for s in self.samples if s.phase == name], end - start)
                  for name, start, end in self.phase_spans}
        out = {"overall": overall, "phases": phases, "skipped": self.skipped}
        if self.ladder is not None:
            out["ladder_engaged"] = self.ladder.engaged
        return out

    def to_json(self) -> dict[str, Any]:
        c = self.config
        return {
            "label": c.label, "time": datetime.now(UTC).isoformat(timespec="seconds"),
            "config": {"url": c.chat_url, "model": c.model, "mode": c.mode, "mix": c.mix, "max_tokens": c.max_tokens,
                       "stream": c.stream, "tenants": [t.name for t in c.tenants], "seed": c.seed,
                       "phases": [vars_of(p) for p in c.phases]},
            "wall_s": round(self.wall_s, 3), "summary": self.summary(), "series": per_second(self.samples),
            "ladder_timeline": self.ladder.timeline if self.ladder else [],
            "samples": [s.to_json() for s in self.samples],
        }


def vars_of(phase: Phase) -> dict[str, Any]:
    return {"name": phase.name, "duration_s": phase.duration_s, "start": phase.start, "end": phase.end}


class _Runner:
    """Builds request specs and keeps the samples and the in-flight count of one run."""

    def __init__(self, config: LoadConfig, session: aiohttp.ClientSession) -> None:
        self.config = config
        self.session = session
        self.mix = PromptMix(config.mix, seed=config.seed)
        self.rng = random.Random(config.seed + 1)
        self.samples: list[Sample] = []
        self.in_flight = 0
        self.skipped = 0
        self.t0 = time.monotonic()

    def spec(self, phase: str) -> RequestSpec:
        c = self.config
        item = self.mix.draw()
        tenant = self.rng.choices(c.tenants, [t.weight for t in c.tenants])[0]
        body: dict[str, Any] = {"model": c.model, "messages": list(item.messages), "max_tokens": c.max_tokens,
                                "temperature": 0.0, "stream": c.stream}
        if c.stream:
            body["stream_options"] = {"include_usage": True}
        if c.ignore_eos:
            body["ignore_eos"] = True
        headers = {"content-type": "application/json"}
        if tenant.api_key:
            headers["authorization"] = f"Bearer {tenant.api_key}"
        return RequestSpec(c.chat_url, orjson.dumps(body), headers, phase, item.kind, tenant.name, c.stream)

    async def fire(self, phase: str) -> None:
        spec = self.spec(phase)
        self.in_flight += 1
        try:
            self.samples.append(await send_one(self.session, spec, time.monotonic() - self.t0,
                                               self.config.answering))
        finally:
            self.in_flight -= 1


async def _open_loop(runner: _Runner, phases: list[Phase], spans: list[tuple[str, float, float]]) -> None:
    rng = random.Random(runner.config.seed + 2)
    tasks: set[asyncio.Task[None]] = set()
    t = 0.0
    for phase in phases:
        start, end = t, t + phase.duration_s
        spans.append((phase.name, start, end))
        while True:
            rate = phase.level_at(t - start)
            t += rng.expovariate(rate) if rate > 0 else 0.05
            if t >= end:
                break
            if rate <= 0:
                continue
            delay = runner.t0 + t - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if runner.in_flight >= runner.config.max_in_flight:
                runner.skipped += 1
                continue
            task = asyncio.create_task(runner.fire(phase.name))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        t = end
    delay = runner.t0 + t - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
    if tasks:
        await asyncio.gather(*tasks)


async def _closed_loop(runner: _Runner, phases: list[Phase], spans: list[tuple[str, float, float]]) -> None:
    for phase in phases:
        start = time.monotonic() - runner.t0
        deadline = runner.t0 + start + phase.duration_s
        spans.append((phase.name, start, start + phase.duration_s))

        async def worker(name: str = phase.name, until: float = deadline) -> None:
            while time.monotonic() < until:
                await runner.fire(name)

        await asyncio.gather(*(worker() for _ in range(max(1, round(phase.start)))))


def _progress_line(runner: _Runner, spans: list[tuple[str, float, float]]) -> str:
    elapsed = time.monotonic() - runner.t0
    recent = [s for s in runner.samples[-200:] if s.ok and s.ttft_s is not None]
    ttft = sorted(s.ttft_s or 0.0 for s in recent)
    classes: dict[str, int] = {}
    for s in runner.samples:
        key = status_class(s)
        classes[key] = classes.get(key, 0) + 1
    phase = spans[-1][0] if spans else "-"
    p50 = f"{1000 * ttft[len(ttft) // 2]:.0f}" if ttft else "-"
    return (f"[{elapsed:6.1f}s {phase:<10}] done {len(runner.samples):5d} ok {classes.get('ok', 0):5d} "
            f"429 {classes.get('429', 0):4d} 5xx {classes.get('5xx', 0):3d} other "
            f"{sum(v for k, v in classes.items() if k not in ('ok', '429', '5xx')):3d} "
            f"in-flight {runner.in_flight:4d} ttft p50 {p50} ms")


async def _progress(runner: _Runner, spans: list[tuple[str, float, float]], stop: asyncio.Event) -> None:
    tty = sys.stderr.isatty()
    ticks = 0
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), 1.0)
        except TimeoutError:
            ticks += 1
            if tty or ticks % 5 == 0:
                print(("\r" if tty else "") + _progress_line(runner, spans), end="" if tty else "\n",
                      file=sys.stderr, flush=True)
    if tty:
        print(file=sys.stderr)


async def run_load(config: LoadConfig) -> LoadRun:
    """Run the phases against the target; returns every sample and the ladder timeline."""
    timeout = aiohttp.ClientTimeout(total=config.timeout_s)
    async with aiohttp.ClientSession(connector=connector(config.max_in_flight + 16), timeout=timeout) as session:
        runner = _Runner(config, session)
        spans: list[tuple[str, float, float]] = []
        stop = asyncio.Event()
        watch = LadderWatch(config.metrics_url, config.metrics_interval_s) if config.metrics_url else None
        side: list[asyncio.Task[None]] = []
        if watch is not None:
            side.append(asyncio.create_task(watch.run(session, runner.t0, stop)))
        if config.progress:
            side.append(asyncio.create_task(_progress(runner, spans, stop)))
        loop = _open_loop if config.mode == "open" else _closed_loop
        try:
            await loop(runner, config.phases, spans)
        finally:
            wall = time.monotonic() - runner.t0
            stop.set()
            await asyncio.gather(*side)
    return LoadRun(config, runner.samples, wall, spans, watch, runner.skipped, runner.t0)


def write_results(run: LoadRun, out_dir: Path = RESULTS_DIR, stem: str | None = None) -> tuple[Path, Path]:
    """Write `<stem>.json` and `<stem>.png` under `out_dir`; returns both paths."""
    stem = stem or f"{run.config.label}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}"
    out_dir.mkdir(parents=True, exist_ok=True)
    data = run.to_json()
    json_path = out_dir / f"{stem}.json"
    json_path.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))
    png = plot_run(out_dir / f"{stem}.png", f"{run.config.label}: {run.config.chat_url} model={run.config.model}",
                   data["series"], run.phase_spans, run.ladder.timeline if run.ladder else [])
    return json_path, png


def _fmt(p: dict[str, float | None]) -> str:
    return " / ".join("-" if v is None else f"{v:.0f}" if v >= 10 else f"{v:.1f}" for v in p.values())


def format_summary(summary: dict[str, Any]) -> str:
    """Human-readable table: one line per phase and one for the whole run."""
    head = (f"{'phase':<12}{'sent':>6}{'ok':>6}{'req/s':>8}{'tok/s':>8}{'429':>5}{'R-A':>5}{'5xx':>5}{'other':>6}"
            f"  {'TTFT p50/95/99 ms':<20}{'ITL p50/95/99 ms':<19}{'e2e p50/95/99 ms':<20}pools")
    lines = [head]
    rows = [*summary["phases"].items(), ("ALL", summary["overall"])]
    for name, s in rows:
        cls = s["classes"]
        other = sum(v for k, v in cls.items() if k not in ("ok", "429", "5xx"))
        pools = " ".join(f"{p}={v:.0%}" for p, v in s["pool_share"].items())
        lines.append(f"{name:<12}{s['sent']:>6}{s['ok']:>6}{s['throughput_rps'] or 0:>8.2f}"
                     f"{s['tokens_per_s'] or 0:>8.0f}{s['rejected_429']:>5}{s['retry_after_seen']:>5}"
                     f"{cls.get('5xx', 0):>5}{other:>6}  {_fmt(s['ttft_ms']):<20}{_fmt(s['itl_ms']):<19}"
                     f"{_fmt(s['e2e_ms']):<20}{pools}")
    if "ladder_engaged" in summary:
        lines.append(f"degradation steps engaged: {', '.join(summary['ladder_engaged']) or 'none'}")
    errors = summary["overall"]["error_examples"]
    if errors:
        lines.append("errors, e.g.: " + " | ".join(errors[:3]))
    return "\n".join(lines)


def _tenant(text: str) -> TenantKey:
    name, _, rest = text.partition("=")
    key, sep, weight = rest.rpartition(":")
    if not sep:
        key, weight = rest, "1"
    try:
        value = float(weight)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"bad weight in --tenant {text!r}") from exc
    if not name or not key or value < 0:
        raise argparse.ArgumentTypeError(f"bad --tenant {text!r}: use NAME=API_KEY[:WEIGHT]")
    return TenantKey(name, key, value)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m loadtest.load", description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        epilog="examples:\n  python -m loadtest.load --url http://127.0.0.1:8080 --model auto "
        "--phases steady:20s@2,surge:30s@10,recover:30s@2 --metrics-url http://127.0.0.1:8080/metrics\n"
        "  python -m loadtest.load --url http://127.0.0.1:8101 --model micro --mode closed --phases run:30s@8")
    p.add_argument("--url", required=True, help="base URL of an OpenAI-compatible server (with or without /v1)")
    p.add_argument("--model", default="auto", help="model name: 'auto', a pool name, or the engine's served name")
    p.add_argument("--mode", choices=["open", "closed"], default="open",
                   help="open: Poisson arrivals at the phase's rate; closed: the phase's number of clients")
    p.add_argument("--phases", default="run:30s@2",
                   help="NAME:SECONDSs@LEVEL[->LEVEL],... (LEVEL: req/s in open mode, clients in closed mode)")
    p.add_argument("--mix", default=DEFAULT_MIX, help="prompt classes and weights (short|long)-(easy|hard):W,...")
    p.add_argument("--tenant", action="append", type=_tenant, default=None, metavar="NAME=KEY[:WEIGHT]",
                   help="send under this API key (repeat for a mix; default: no key)")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--no-stream", action="store_true", help="non-streaming requests (no TTFT/ITL)")
    p.add_argument("--no-ignore-eos", action="store_true", help="do not send vLLM's ignore_eos extension")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    p.add_argument("--metrics-url", help="a gateway /metrics to watch for active degradation steps")
    p.add_argument("--max-in-flight", type=int, default=2000, help="open loop: arrivals beyond this are skipped")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--label", default="load", help="name of the result files")
    p.add_argument("--out", type=Path, default=RESULTS_DIR, help="folder for the JSON and PNG results")
    p.add_argument("--quiet", action="store_true", help="no live progress line")
    return p


def config_from_args(args: argparse.Namespace) -> LoadConfig:
    return LoadConfig(
        base_url=args.url, model=args.model, phases=parse_phases(args.phases), mode=args.mode,
        mix=parse_mix(args.mix), tenants=args.tenant or [TenantKey("default", None)], max_tokens=args.max_tokens,
        stream=not args.no_stream, ignore_eos=not args.no_ignore_eos, seed=args.seed, timeout_s=args.timeout,
        metrics_url=args.metrics_url, max_in_flight=args.max_in_flight, progress=not args.quiet, label=args.label,
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    run = asyncio.run(run_load(config))
    print(format_summary(run.summary()))
    json_path, png = write_results(run, args.out)
    print(f"results: {json_path}\nplot:    {png}")
    return 0 if run.samples else 1


if __name__ == "__main__":
    raise SystemExit(main())
