"""Offer a Poisson load of realistic prompts to the complexity scorer and report throughput and latency.

In-process (default): builds the real scorer with `load_scorer` and calls `score([text])` once per
arrival, as the gateway does per request. With `--gateway-url`, sends the same prompts as chat
completions to a running gateway instead (end-to-end, includes the engine; optional).

Latency is measured from each request's *scheduled* arrival time, so a scorer that falls behind cannot
hide its queueing delay (no coordinated omission). Prompts are made unique by default (`--repeat-share`
sets how many arrivals reuse a recent prompt and may hit the cache).

    python -m loadtest.scorer_bench --rates 100,200,250 --duration 10 --threads 2
    python -m loadtest.scorer_bench --artifacts OLD.json,NEW.json --repeats 3   # side by side, interleaved
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import random
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

__all__ = ["main", "offer_load", "realistic_prompts"]

ScoreOne = Callable[[str], Awaitable[float | None]]


def realistic_prompts(seed: int) -> Iterator[str]:
    """Endless distinct prompts from the package's generators (chat, tasks, code, reasoning, math): each
    generated prompt once, then the same ones tagged with a request number so none repeats exactly."""
    from router_models.datagen.eval_prompts import eval_examples
    from router_models.datagen.train_heavy import heavy_examples
    from router_models.datagen.train_light import light_examples

    rng = random.Random(seed)
    pool = [str(r["prompt"]) for r in light_examples(rng) + heavy_examples(rng) + eval_examples(rng)]
    rng.shuffle(pool)
    yield from pool
    for i in itertools.count():
        yield f"{pool[i % len(pool)]} (request {i})"


@dataclass(frozen=True)
class Result:
    """One load level: offered rate (req/s), achieved throughput (req/s), latencies in ms."""

    offered: float
    completed: int
    throughput: float
    p50_ms: float
    p99_ms: float
    errors: int
    cpu_ms: float


async def offer_load(score_one: ScoreOne, prompts: Iterator[str], rate: float, duration: float,
                     repeat_share: float, seed: int) -> Result:
    """Poisson arrivals at `rate` req/s for `duration` s; each arrival scores one prompt."""
    rng = random.Random(seed)
    latencies: list[float] = []
    errors = [0]
    start = time.perf_counter()
    cpu_start = time.process_time()

    async def one(text: str, scheduled: float) -> None:
        try:
            await score_one(text)
            latencies.append((time.perf_counter() - scheduled) * 1000)
        except Exception:  # a failed request counts as an error, not a latency
            errors[0] += 1

    tasks: list[asyncio.Task[None]] = []
    sent: list[str] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        if t > duration:
            break
        delay = start + t - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        text = rng.choice(sent[-200:]) if sent and rng.random() < repeat_share else next(prompts)
        sent.append(text)
        tasks.append(asyncio.create_task(one(text, start + t)))
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - start
    cpu_ms = (time.process_time() - cpu_start) * 1000 / max(1, len(latencies))
    lat = sorted(latencies) or [float("nan")]
    return Result(rate, len(latencies), len(latencies) / elapsed, statistics.median(lat),
                  lat[min(len(lat) - 1, int(0.99 * len(lat)))], errors[0], cpu_ms)


Scorer = tuple[ScoreOne, Callable[[], Awaitable[None]], Callable[[], str]]


def _in_process(args: argparse.Namespace, artifact: str | None, threads: int) -> Scorer:
    from router_models.serving import BatchingConfig, load_scorer

    scorer = load_scorer(artifact, BatchingConfig(max_wait_ms=args.max_wait_ms, max_batch=args.max_batch),
                         torch_threads=threads)

    async def score_one(text: str) -> float:
        return (await scorer.score([text]))[0]

    def stats() -> str:
        sizes = scorer.batch_sizes or [0]
        line = f"batches={len(sizes)} mean_batch={statistics.mean(sizes):.1f} max_batch={max(sizes)}"
        scorer.batch_sizes.clear()
        return line

    return score_one, scorer.aclose, stats


def _via_gateway(args: argparse.Namespace, artifact: str | None, threads: int) -> Scorer:
    import aiohttp

    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256))
    url = args.gateway_url.rstrip("/") + "/v1/chat/completions"
    headers = {"authorization": f"Bearer {args.api_key}"} if args.api_key else {}

    async def score_one(text: str) -> float | None:
        body = {"model": "auto", "max_tokens": 1, "messages": [{"role": "user", "content": text}]}
        async with session.post(url, json=body, headers=headers) as resp:
            await resp.read()
            resp.raise_for_status()
            value = resp.headers.get("x-cascade-score")
            return float(value) if value is not None else None

    return score_one, session.close, lambda: "via gateway"


def _label(artifact: str | None) -> str:
    from router_models.artifact import load_artifact

    return load_artifact(artifact).embedder if artifact else "shipped:" + load_artifact().embedder


def _med(results: list[Result], key: str) -> str:
    vals = sorted(float(getattr(r, key)) for r in results)
    return f"{statistics.median(vals):7.1f} ({vals[0]:.1f}-{vals[-1]:.1f})"


def _summary(rows: dict[tuple[str, float], list[Result]]) -> None:
    print("\nmedian over repeats (min-max):")
    for (label, rate), res in rows.items():
        print(f"{label:38} offered {rate:5.0f}: scored/s {_med(res, 'throughput')}  p50 ms {_med(res, 'p50_ms')}  "
              f"p99 ms {_med(res, 'p99_ms')}  CPU ms/req {_med(res, 'cpu_ms')}")


async def _run(args: argparse.Namespace) -> None:
    artifacts: list[str | None] = list(args.artifacts.split(",")) if args.artifacts else [None]
    make = _via_gateway if args.gateway_url else _in_process
    threads = [int(t) for t in args.threads.split(",")]
    scorers = [(f"{_label(a)}@t{t}" if not args.gateway_url else "gateway", make(args, a, t))
               for a, t in itertools.product(artifacts, threads)]
    prompts = {label: realistic_prompts(args.seed) for label, _ in scorers}  # every scorer sees the same prompts
    rows: dict[tuple[str, float], list[Result]] = {}
    try:
        for label, (score_one, _, _) in scorers:
            await offer_load(score_one, prompts[label], 20, 1.0, 0.0, args.seed)  # warm-up
        rates = [float(r) for r in args.rates.split(",")]
        for rep, (k, rate) in itertools.product(range(args.repeats), enumerate(rates)):
            for label, (score_one, _, stats) in scorers:
                res = await offer_load(score_one, prompts[label], rate, args.duration, args.repeat_share,
                                       args.seed + 100 * rep + k)
                rows.setdefault((label, rate), []).append(res)
                print(f"[{rep}] {label}: offered {res.offered:4.0f} req/s -> {res.throughput:6.1f} scored/s, "
                      f"p50 {res.p50_ms:6.1f} ms, p99 {res.p99_ms:7.1f} ms, errors {res.errors}, "
                      f"process CPU {res.cpu_ms:.1f} ms/req ({stats()}) load {os.getloadavg()[0]:.2f}", flush=True)
    finally:
        for _, (_, close, _) in scorers:
            await close()
    _summary(rows)


def main() -> None:
    """CLI entry point; see the module docstring."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", default="100,200,250", help="comma-separated offered rates, req/s")
    p.add_argument("--duration", type=float, default=10.0, help="seconds per rate")
    p.add_argument("--threads", default="2", help="intra-op threads of the embedder (torch or ONNX); a comma "
                   "list compares ONNX sessions side by side (torch's thread count is process-wide: last wins)")
    p.add_argument("--artifacts", default=None,
                   help="comma-separated artifact .json paths, benchmarked side by side (default: the shipped one)")
    p.add_argument("--repeats", type=int, default=1, help="rounds; each round runs every rate on every scorer")
    p.add_argument("--max-wait-ms", type=float, default=2.0, help="micro-batch collection window")
    p.add_argument("--max-batch", type=int, default=32, help="largest micro-batch")
    p.add_argument("--repeat-share", type=float, default=0.0, help="share of arrivals reusing a recent prompt")
    p.add_argument("--gateway-url", default=None, help="send through a running gateway instead")
    p.add_argument("--api-key", default=os.environ.get("CASCADE_API_KEY"), help="gateway API key")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    asyncio.run(_run(args))


if __name__ == "__main__":
    main()
