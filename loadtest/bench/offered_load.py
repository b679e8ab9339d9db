"""Open-loop (Poisson) load on one scoring function, measured from each request's *scheduled* arrival time so a
scorer that falls behind cannot hide its queueing delay (no coordinated omission). Used by `bench.scorer` in
process and by its per-tree workers (`scorer_variants`), so every variant sees the same load generator.

Run it on a `fine_timer_loop`: asyncio's default selector (epoll) rounds every timeout up to a whole millisecond,
so each arrival would start 0-1 ms after its scheduled time (measured: 0.5-0.8 ms at the median) and that delay,
the generator's and not the scorer's, would count in every latency. `select()` waits to the microsecond. A real
request needs no timer: its socket wakes the loop."""

from __future__ import annotations

import asyncio
import random
import selectors
import statistics
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["Result", "ScoreOne", "fine_timer_loop", "offer_load", "run_on_time"]

ScoreOne = Callable[[str], Awaitable[float | None]]


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


def fine_timer_loop() -> asyncio.AbstractEventLoop:
    """An event loop whose timers fire within microseconds of their time (`select()`; module docstring), for
    `asyncio.Runner(loop_factory=...)`. For a bench's few file descriptors only (select's limit is 1,024)."""
    return asyncio.SelectorEventLoop(selectors.SelectSelector())


T = TypeVar("T")


def run_on_time(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on a `fine_timer_loop`: what a bench that offers load runs its arrivals on."""
    with asyncio.Runner(loop_factory=fine_timer_loop) as runner:
        return runner.run(main)


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
