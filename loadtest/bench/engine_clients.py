"""The engine clients side by side: client CPU per request and requests/s, `h1` against aiohttp, on one
machine in one run, against the zero-latency fake engine (`loadtest.fake_upstream`, its own process).

Each cell (non-streaming; streaming with one token per millisecond, the way an engine sends them; streaming
at zero latency, where tokens arrive in big reads) runs every transport once per round, the order
alternating per round; the client runs under uvloop, as the gateway does. CPU is this process's
`time.process_time()` over the measured requests (the fake engine's CPU is not in it). Reported: medians
over rounds, and the ratios of the first transport to the second. `python -m loadtest.bench.engine_clients`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

import orjson
import uvloop

from backends.clients.shared import make_engine_client
from backends.clients.transports import TRANSPORTS, Transport
from loadtest.processes import free_port, wait_ready

__all__ = ["Cell", "Measured", "main", "measure"]

CHAT = "/v1/chat/completions"


@dataclass(frozen=True, slots=True)
class Cell:
    """One kind of traffic: `requests` in all, `concurrency` at once, `tokens` per answer."""

    name: str
    stream: bool
    requests: int
    concurrency: int
    tokens: int
    delay_ms: float

    def body(self) -> bytes:
        return orjson.dumps({"model": "fake", "messages": [{"role": "user", "content": "hello there"}],
                             "max_tokens": self.tokens, "stream": self.stream,
                             "stream_options": {"include_usage": True},
                             "metadata": {"fake_tokens": self.tokens, "fake_delay_ms": self.delay_ms}})


@dataclass(frozen=True, slots=True)
class Measured:
    cpu_us_per_request: float
    requests_per_s: float


async def measure(transport: Transport, url: str, cell: Cell) -> Measured:
    """One run of `cell` through a fresh client (its pool warmed by one request per concurrent worker)."""
    client = make_engine_client(transport)
    body, left = cell.body(), [cell.requests]

    async def one() -> None:
        if cell.stream:
            async with client.stream(url, CHAT, body) as chunks:
                async for _ in chunks:
                    pass
        else:
            await client.post_json(url, CHAT, body)

    async def worker() -> None:
        while left[0] > 0:
            left[0] -= 1
            await one()

    try:
        await asyncio.gather(*(one() for _ in range(cell.concurrency)))
        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(cell.concurrency)))
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    finally:
        await client.aclose()
    return Measured(cpu / cell.requests * 1e6, cell.requests / wall)


def _cells(args: argparse.Namespace) -> list[Cell]:
    c = args.concurrency
    return [Cell(f"non-streaming, c={c}, 16 tokens", False, args.requests, c, 16, 0.0),
            Cell(f"streaming, c={c}, 64 tokens at 1 ms each", True, args.streams, c, 64, 1.0),
            Cell(f"streaming, c={c}, 64 tokens at zero latency", True, args.streams, c, 64, 0.0)]


async def _run(args: argparse.Namespace, url: str) -> dict[str, object]:
    transports: list[Transport] = args.transports
    results: dict[str, object] = {}
    for cell in _cells(args):
        rows: dict[Transport, list[Measured]] = {t: [] for t in transports}
        for r in range(args.rounds):
            for transport in transports if r % 2 == 0 else transports[::-1]:
                rows[transport].append(await measure(transport, url, cell))
        medians = {t: Measured(statistics.median(m.cpu_us_per_request for m in ms),
                               statistics.median(m.requests_per_s for m in ms)) for t, ms in rows.items()}
        first, second = (medians[t] for t in transports[:2])
        results[cell.name] = {
            "median": {t: asdict(m) for t, m in medians.items()},
            "cpu_per_request_ratio": first.cpu_us_per_request / second.cpu_us_per_request,
            "requests_per_s_ratio": first.requests_per_s / second.requests_per_s,
            "cpu_us_per_request_by_round": {t: [round(m.cpu_us_per_request) for m in ms] for t, ms in rows.items()},
        }
        print(f"{cell.name}: " + ", ".join(f"{t} {m.cpu_us_per_request:.0f} us/req {m.requests_per_s:.0f} req/s"
                                           for t, m in medians.items()), file=sys.stderr, flush=True)
    return results


def _transports(text: str) -> list[Transport]:
    chosen = [t for t in TRANSPORTS if t in text.split(",")]
    if len(chosen) != 2:
        raise argparse.ArgumentTypeError(f"two of {', '.join(TRANSPORTS)}, comma-separated")
    return chosen if text.split(",")[0] == chosen[0] else chosen[::-1]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.engine_clients", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--transports", type=_transports, default=["h1", "aiohttp"], help="two, the first compared "
                   "to the second (default h1,aiohttp)")
    p.add_argument("--rounds", type=int, default=4, help="rounds per cell (default 4)")
    p.add_argument("--concurrency", type=int, default=16, help="requests at once (default 16)")
    p.add_argument("--requests", type=int, default=3000, help="non-streaming requests per run (default 3000)")
    p.add_argument("--streams", type=int, default=600, help="streams per run (default 600)")
    args = p.parse_args(argv)
    port = free_port()
    engine = subprocess.Popen([sys.executable, "-m", "loadtest.fake_upstream", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url + "/health", engine, 30, "fake engine", lambda: "")
        results = uvloop.run(_run(args, url))
    finally:
        engine.terminate()
        engine.wait(10)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
