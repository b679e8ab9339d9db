"""Speculative decoding against none: the same engine and model with and without it, on three kinds of traffic.

Two vLLM engines serve the same model (the demo micro model unless `--model`), one with n-gram prompt lookup
(`--speculative-config` as `backends.engines.args` renders a policy's `speculative` block), one without. Both are
started once; while one is measured the other is paused (SIGSTOP to its process group), so they never share the
cores and an idle engine's busy-polling core steals nothing. With `--pin-engine-core` each engine core is pinned
to its worker's cores, as the supervisor pins an engine alone on its host. Rounds interleave (spec first in odd
rounds, plain first in even ones). Each round sends every mix to each engine: `--requests` streamed chat requests,
`--concurrency` at once, greedy, `ignore_eos` so both engines write exactly as many tokens:

- `echo`: work that copies its input (extract fields, rewrite a paragraph, edit code), where prompt lookup has
  something to find;
- `chat`: short open questions;
- `long`: a short prompt and a long answer.

Reported per mix and engine (medians over rounds, after one unmeasured warm-up pass): completion tokens/s (all
tokens over wall time), ITL p50/p99 (gaps between streamed content events: with speculation one event can carry
several tokens, and events read together show a gap of 0), TPOT p50 (each stream's time per output token after
the first: the decode speed one user sees), TTFT p50, and the acceptance rate over the mix (accepted / drafted
tokens, the difference of vLLM's counters before and after, read with the gateway's own parser
`backends.clients.pool.parse_vllm_metrics`); then spec / no-spec ratios.

The demo models are tiny random networks: their text means nothing, so what prompt lookup finds in it says
nothing about real traffic (a random model seldom copies its prompt, though it often loops on its own output,
which prompt lookup also matches). The figures measure the mechanism and its cost on this machine, not the gain
on real work. `python -m loadtest.bench.speculative --rounds 2` (run it under `flock /tmp/cascade-engines.lock`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from backends.clients.pool import EngineLoad, parse_vllm_metrics
from backends.engines.args import engine_command, engine_env
from backends.engines.cpu_pinning import cpus_of, engine_processes, set_affinity
from backends.models.demo import ensure_demo_models, models_root
from loadtest.load.connections import connector
from loadtest.load.stream_client import percentile
from loadtest.processes import free_port, wait_ready
from policies.schema import EngineSpec
from policies.speculative import NgramSpeculation

__all__ = ["MIXES", "Mix", "MixResult", "main"]

_RECORD = ("name: Ada Lovelace; born: 10 December 1815; city: London; field: mathematics; known for: the first "
           "published computer program, notes on the Analytical Engine; father: Lord Byron; died: 27 November 1852")
_PARAGRAPH = ("The committee met on Tuesday to review the budget for the new library wing. After a long "
              "discussion the members agreed that the reading room should open in the spring, that the archive "
              "should move to the basement, and that the children's corner should keep its current opening hours.")
_CODE = ("def total_price(items, tax_rate):\n    subtotal = 0\n    for item in items:\n"
         "        subtotal = subtotal + item.price * item.quantity\n    tax = subtotal * tax_rate\n"
         "    return subtotal + tax\n")


@dataclass(frozen=True, slots=True)
class Mix:
    """One kind of traffic: prompts sent round-robin, `max_tokens` per answer."""

    name: str
    prompts: tuple[str, ...]
    max_tokens: int


MIXES = (
    Mix("echo", (f"Extract every field of this record as JSON, values copied exactly:\n{_RECORD}",
                 f"Rewrite this paragraph, keeping every sentence, in the past tense:\n{_PARAGRAPH}",
                 f"Rename `subtotal` to `net` in this function and return the whole function:\n{_CODE}"), 128),
    Mix("chat", ("What should I cook tonight?", "Why is the sky blue?", "Give me a name for a cat.",
                 "How do I keep basil alive?"), 64),
    Mix("long", ("Write a long, detailed essay on the history of bridges.",
                 "Tell me a long story about a lighthouse keeper."), 384),
)


@dataclass(slots=True)
class _Sample:
    tokens: int = 0
    ttft_s: float | None = None
    gaps_s: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first: the stream's decode time over its tokens (robust to events
        that carry several tokens, or arrive in one read)."""
        return sum(self.gaps_s) / (self.tokens - 1) if self.tokens > 1 and self.gaps_s else None


@dataclass(frozen=True, slots=True)
class MixResult:
    """One mix on one engine in one round."""

    tokens_per_s: float
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    tpot_p50_ms: float | None
    ttft_p50_ms: float | None
    acceptance: float | None
    errors: int


@dataclass(slots=True)
class _Engine:
    name: str
    url: str
    proc: subprocess.Popen[bytes]

    def pause(self) -> None:
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.killpg(self.proc.pid, signal.SIGCONT)


def _body(model: str, prompt: str, max_tokens: int) -> bytes:
    return orjson.dumps({"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                         "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True,
                         "temperature": 0.0})


async def _one(session: aiohttp.ClientSession, url: str, body: bytes) -> _Sample:
    sample, started = _Sample(), time.monotonic()
    last: float | None = None
    try:
        async with session.post(url + "/v1/chat/completions", data=body,
                                headers={"content-type": "application/json"}) as resp:
            if resp.status != 200:
                sample.error = f"HTTP {resp.status}"
                return sample
            async for raw in resp.content:
                line = raw.rstrip(b"\r\n")
                if not line.startswith(b"data: {"):
                    continue
                chunk = orjson.loads(line[6:])
                if chunk.get("usage"):
                    sample.tokens = int(chunk["usage"].get("completion_tokens") or 0)
                if any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or ()):
                    now = time.monotonic()
                    if last is None:
                        sample.ttft_s = now - started
                    else:
                        sample.gaps_s.append(now - last)
                    last = now
    except (aiohttp.ClientError, TimeoutError) as exc:
        sample.error = f"{type(exc).__name__}: {exc}"
    return sample


async def _load(session: aiohttp.ClientSession, url: str) -> EngineLoad:
    async with session.get(url + "/metrics") as resp:
        return parse_vllm_metrics(await resp.text())


async def _run_mix(engine: _Engine, model: str, mix: Mix, requests: int, concurrency: int) -> MixResult:
    bodies = [_body(model, mix.prompts[i % len(mix.prompts)], mix.max_tokens) for i in range(requests)]
    samples: list[_Sample] = []
    async with aiohttp.ClientSession(connector=connector(100), timeout=aiohttp.ClientTimeout(total=600)) as session:
        before = await _load(session, engine.url)
        started = time.monotonic()

        async def worker() -> None:
            while bodies:
                samples.append(await _one(session, engine.url, bodies.pop()))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.monotonic() - started
        await asyncio.sleep(1.5)  # vLLM's counters are updated by its stat logger, a moment after the last step
        after = await _load(session, engine.url)
    good = [s for s in samples if s.error is None]
    gaps = [g * 1000 for s in good for g in s.gaps_s]
    drafted = after.draft_tokens - before.draft_tokens
    return MixResult(
        tokens_per_s=sum(s.tokens for s in good) / wall, itl_p50_ms=percentile(gaps, 50),
        itl_p99_ms=percentile(gaps, 99),
        tpot_p50_ms=percentile([s.tpot_s * 1000 for s in good if s.tpot_s is not None], 50),
        ttft_p50_ms=percentile([s.ttft_s * 1000 for s in good if s.ttft_s is not None], 50),
        acceptance=(after.accepted_tokens - before.accepted_tokens) / drafted if drafted > 0 else None,
        errors=len(samples) - len(good))


def _pin_engine_core(engine: _Engine) -> list[int]:
    """Put the engine core on its worker's cores, as the supervisor does for an engine alone on its host
    (`backends.engines.cpu_pinning.pin_engine_core`, which declines here: the paused twin's worker shares those
    cores, though the two never run at once). Unpinned, the busy-polling core starves the API server."""
    procs = engine_processes(engine.proc.pid)
    cpus = cpus_of(procs.workers)
    for pid in procs.engine_cores if cpus else ():
        set_affinity(pid, cpus)
    return sorted(cpus)


@contextmanager
def _started(name: str, spec: EngineSpec, log_dir: Path) -> Iterator[_Engine]:
    port = free_port()
    cmd = engine_command(spec, port)
    env = {**os.environ, **engine_env(spec)}
    with (log_dir / f"{name}.log").open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    engine = _Engine(name, f"http://127.0.0.1:{port}", proc)
    try:
        yield engine
    finally:
        engine.resume()
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _spec(args: argparse.Namespace, speculative: bool) -> EngineSpec:
    ngram = NgramSpeculation(method="ngram", num_speculative_tokens=args.tokens, prompt_lookup_min=2,
                             prompt_lookup_max=4)
    return EngineSpec(model=args.model, served_name="bench", max_model_len=1024, dtype="bfloat16",
                      kv_cache_space_gib=1, extra_args=("--enforce-eager",), env=dict(args.env),
                      speculative=ngram if speculative else None)


async def _rounds(args: argparse.Namespace, engines: list[_Engine]) -> dict[str, dict[str, list[MixResult]]]:
    results: dict[str, dict[str, list[MixResult]]] = {e.name: {m.name: [] for m in MIXES} for e in engines}
    for engine in engines:  # a fresh engine's first requests are slow (allocations, first kernels): not measured
        engine.resume()
        for mix in MIXES:
            await _run_mix(engine, "bench", mix, args.concurrency, args.concurrency)
        engine.pause()
    for r in range(args.rounds):
        for engine in engines if r % 2 == 0 else engines[::-1]:
            engine.resume()
            for mix in MIXES:
                res = await _run_mix(engine, "bench", mix, args.requests, args.concurrency)
                results[engine.name][mix.name].append(res)
                print(f"round {r + 1} {engine.name:7} {mix.name:5} {res.tokens_per_s:7.1f} tok/s, ITL p50 "
                      f"{res.itl_p50_ms or 0:.1f} ms, acceptance {res.acceptance}", file=sys.stderr, flush=True)
            engine.pause()
    return results


def _median(rows: list[MixResult], key: str) -> float | None:
    values = [v for v in (getattr(r, key) for r in rows) if v is not None]
    return statistics.median(values) if values else None


def _ratio(spec: float | None, plain: float | None) -> float | None:
    return spec / plain if spec is not None and plain else None


def summarise(results: dict[str, dict[str, list[MixResult]]]) -> dict[str, Any]:
    """Medians per engine and mix, and the ratios spec / plain."""
    keys = ("tokens_per_s", "itl_p50_ms", "itl_p99_ms", "tpot_p50_ms", "ttft_p50_ms", "acceptance")
    out: dict[str, Any] = {}
    for mix in MIXES:
        med = {name: {k: _median(by_mix[mix.name], k) for k in keys} for name, by_mix in results.items()}
        ratios = {k: _ratio(med["spec"][k], med["plain"][k]) for k in keys[:5]}
        out[mix.name] = {"median": med, "ratio_spec_over_plain": ratios,
                         "rounds": {n: [asdict(r) for r in by_mix[mix.name]] for n, by_mix in results.items()}}
    return out


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table(summary: dict[str, Any]) -> str:
    """The markdown table BENCHMARKS.md shows."""
    lines = ["| mix | tokens/s plain / spec (ratio) | ITL p50 ms plain / spec | ITL p99 ms plain / spec | "
             "TPOT p50 ms plain / spec | TTFT p50 ms plain / spec | acceptance |", "|---|---|---|---|---|---|---|"]
    for mix, row in summary.items():
        p, s, q = row["median"]["plain"], row["median"]["spec"], row["ratio_spec_over_plain"]
        lines.append(f"| {mix} | {_fmt(p['tokens_per_s'])} / {_fmt(s['tokens_per_s'])} ({_fmt(q['tokens_per_s'], 2)}) "
                     f"| {_fmt(p['itl_p50_ms'])} / {_fmt(s['itl_p50_ms'])} | {_fmt(p['itl_p99_ms'])} / "
                     f"{_fmt(s['itl_p99_ms'])} | {_fmt(p['tpot_p50_ms'], 2)} / {_fmt(s['tpot_p50_ms'], 2)} | "
                     f"{_fmt(p['ttft_p50_ms'])} / {_fmt(s['ttft_p50_ms'])} | "
                     f"{_fmt(s['acceptance'], 3)} |")
    return "\n".join(lines)


def _pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r}: NAME=VALUE")
    return name, value


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.speculative", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="demo:micro", help="model directory or demo:NAME (default demo:micro)")
    p.add_argument("--tokens", type=int, default=4, help="num_speculative_tokens (default 4)")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default 2)")
    p.add_argument("--requests", type=int, default=8, help="requests per mix, engine and round (default 8)")
    p.add_argument("--concurrency", type=int, default=2, help="requests at once (default 2)")
    p.add_argument("--pin-engine-core", action="store_true", help="pin each engine core to its worker's cores, "
                   "as the supervisor does (default: as vLLM starts them)")
    p.add_argument("--env", type=_pair, action="append", default=[], metavar="NAME=VALUE",
                   help="set in both engines' environment, e.g. LD_PRELOAD=.venv/lib/libiomp5.so (repeatable)")
    p.add_argument("--logs", type=Path, default=Path(".cascade/bench-speculative"), help="engine logs")
    p.add_argument("--out", type=Path, help="also write the JSON here")
    args = p.parse_args(argv)
    if args.model.startswith("demo:"):
        ensure_demo_models(models_root())
    args.logs.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        engines = []
        for name in ("spec", "plain"):  # one at a time: two engines starting at once on 2 cores take minutes each
            engine = stack.enter_context(_started(name, _spec(args, name == "spec"), args.logs))
            wait_ready(engine.url + "/health", engine.proc, 600, name, partial(_tail, args.logs / f"{name}.log"))
            if args.pin_engine_core:
                print(f"{name}: engine core pinned to cores {_pin_engine_core(engine)}", file=sys.stderr)
            engine.pause()
            engines.append(engine)
        summary = summarise(asyncio.run(_rounds(args, engines)))
    print(table(summary), file=sys.stderr)
    text = json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "mixes": summary}, indent=1)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
