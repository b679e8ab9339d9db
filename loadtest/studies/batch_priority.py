"""Interactive TTFT beside a batch, with and without the engine's priority scheduling (`batches.engine_priority`).

One real demo micro engine (the shipped spec, started with `--scheduling-policy priority`) and two gateways in front
of it (`--no-engines`, following it through an engine registry): one whose policy sets `batches.engine_priority`
(batch lines carry it, interactive requests 0), one without (every request 0: first come, first served); or, with
`--versus preempt`, one with `batches.preempt: true` and one without (neither with a priority). Both keep the lane's
bounds (`--lane`, else its defaults). Each round runs, in order: the interactive load alone; a batch alone (its
lines a second with the engine to itself); then the load beside a batch through each gateway. The interactive load
is open loop (`--rate` streamed chat requests a second); TTFT is the time to the first content event. Per phase it
prints the interactive p50/p99 TTFT, the batch lines answered a second and that rate's share of the batch alone's,
and the share of 0.25 s samples of the lane gauge with a line in flight (both over the time the batch took, where it
finished within the phase: `finished_s`), and the lines preempted (`batches.preempt`, e.g. `--lane "max_interactive:
0, preempt: true"`). After the last round it prints each phase's figures pooled over the rounds, with the p99's ratio
to the load alone's and that ratio's 90% bootstrap interval (`pooled`): one round's p99 is its few slowest requests.

    flock /tmp/cascade-engines.lock python -m loadtest.studies.batch_priority --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import random
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import orjson

from backends.engines.registry import REGISTRY_ENV, publish
from backends.engines.supervisor import EngineSupervisor
from backends.models.demo import models_root
from loadtest.processes import Procs, free_port, gateway_command, wait_ready
from policies.batches import PRIORITY_SCHEDULING
from policies.loader import load_policy
from policies.pools import LocalPool

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "Say hello."


def study_policy(engine: str, priority: int | None, lane: str) -> str:
    bounds = ([lane] if lane else []) + ([] if priority is None else [f"engine_priority: {priority}"])
    batches = f"batches: {{{', '.join(bounds)}}}\n" if bounds else ""
    return f"""version: 1
pools:
  micro:
    type: local
    price: {{input_per_mtok: "0.20", output_per_mtok: "0.20"}}
    engine: {engine}
  flagship:
    type: remote
    urls: ["http://127.0.0.1:9/v1"]
    model: none
    price: {{input_per_mtok: "3.00", output_per_mtok: "15.00"}}
routing: {{micro_pool: micro, flagship_pool: flagship, threshold: 0.99}}
{batches}"""


def _one(client: httpx.Client, url: str, ttfts: list[float]) -> None:
    body = {"model": "micro", "max_tokens": 8, "stream": True, "messages": [{"role": "user", "content": PROMPT}]}
    started = time.monotonic()
    with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        first = True
        for line in r.iter_lines():
            if first and line.startswith("data: ") and '"content"' in line:
                ttfts.append(time.monotonic() - started)
                first = False


def _interactive(url: str, rate: float, seconds: float) -> list[float]:
    """Open loop: one request every 1/rate s for `seconds`, whether or not the last was answered."""
    ttfts: list[float] = []
    sent: list[threading.Thread] = []
    with httpx.Client(timeout=120) as client:
        start = time.monotonic()
        for i in range(int(seconds * rate)):
            time.sleep(max(0.0, start + i / rate - time.monotonic()))
            one = threading.Thread(target=_one, args=(client, url, ttfts), daemon=True)
            one.start()
            sent.append(one)
        for one in sent:
            one.join(120)
    return ttfts


def create_batch(client: httpx.Client, url: str, lines: int) -> str:
    content = b"".join(orjson.dumps({"custom_id": f"l{i}", "method": "POST", "url": "/v1/chat/completions",
                                     "body": {"model": "micro", "max_tokens": 16, "messages": [
                                         {"role": "user", "content": f"Name a colour, number {i}."}]}}) + b"\n"
                       for i in range(lines))
    file = client.post(url + "/v1/files", data={"purpose": "batch"},
                       files={"file": ("lines.jsonl", content, "application/jsonl")}).json()
    return str(client.post(url + "/v1/batches", json={"input_file_id": file["id"], "completion_window": "24h",
                                                      "endpoint": "/v1/chat/completions"}).json()["id"])


def batch_state(client: httpx.Client, url: str, batch: str) -> tuple[str, int, int]:
    """The batch's status, and its lines answered and failed so far."""
    got = client.get(f"{url}/v1/batches/{batch}").json()
    return str(got["status"]), int(got["request_counts"]["completed"]), int(got["request_counts"]["failed"])


def _sample(text: str, series: str) -> float:
    found = [line for line in text.splitlines() if line.startswith(series)]
    return float(found[0].split()[-1]) if found else 0.0


def preempted(url: str) -> float:
    """The gateway's `cascade_batch_lines_preempted_total` on the micro pool."""
    return _sample(httpx.get(url + "/metrics", timeout=5).text, 'cascade_batch_lines_preempted_total{pool="micro"}')


def _lane_share(url: str, stop: threading.Event, samples: list[bool], batch: str | None,
                finished: list[float]) -> None:
    """Every 0.25 s: whether a line is in the lane; when `batch` completed, its time in `finished`."""
    started = time.monotonic()
    with httpx.Client(timeout=5) as client:
        while not stop.wait(0.25):
            samples.append(_sample(client.get(url + "/metrics").text,
                                   'cascade_batch_lane_in_flight{pool="micro"}') > 0)
            if batch and not finished and batch_state(client, url, batch)[0] == "completed":
                finished.append(time.monotonic() - started)


def phase(url: str, rate: float, seconds: float, lines: int) -> dict[str, Any]:
    """The interactive load (rate > 0) for `seconds`, beside a batch of `lines` (0: none) cancelled at the end."""
    client = httpx.Client(timeout=60)
    batch = create_batch(client, url, lines) if lines else None
    stop, samples, finished = threading.Event(), list[bool](), list[float]()
    sampler = threading.Thread(target=_lane_share, args=(url, stop, samples, batch, finished), daemon=True)
    was_preempted = preempted(url)
    sampler.start()
    started, before = time.monotonic(), (batch_state(client, url, batch)[1] if batch else 0)
    ttfts = _interactive(url, rate, seconds) if rate > 0 else []
    time.sleep(max(0.0, started + seconds - time.monotonic()))
    took = time.monotonic() - started
    status, answered, failed = batch_state(client, url, batch) if batch else ("", 0, 0)
    stop.set()
    sampler.join()
    if finished:  # done within the phase: its rate over the time it took, and the lane's share over that time
        took = finished[0]
        samples = samples[:max(1, int(took / 0.25))]
    if batch:
        client.post(f"{url}/v1/batches/{batch}/cancel")
        deadline = time.monotonic() + 120
        while batch_state(client, url, batch)[0] not in ("cancelled", "completed") and time.monotonic() < deadline:
            time.sleep(0.5)
    client.close()
    ordered = sorted(ttfts)
    return {"requests": len(ordered), "p50_ms": statistics.median(ordered) * 1000 if ordered else None,
            "p99_ms": _p99(ordered) * 1000 if ordered else None, "ttfts": ttfts,
            "lines_per_s": (answered - before) / took, "lines_failed": failed, "batch_left": status != "completed",
            "finished_s": finished[0] if finished else None, "preempted": preempted(url) - was_preempted,
            "lane_busy": sum(samples) / len(samples) if samples else 0.0}


def _p99(ordered: list[float]) -> float:
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def pooled(ttfts: dict[str, list[float]], alone: str = "alone", draws: int = 2000) -> list[dict[str, Any]]:
    """Each phase's TTFTs over all rounds: p50, p99 (ms), the p99 over the load alone's and that ratio's 90% interval
    from `draws` bootstrap resamples of both phases (seeded: the same samples give the same interval)."""
    rng, base = random.Random(0), ttfts.get(alone, [])
    base_p99 = _p99(sorted(base)) if base else None
    rows = []
    for label, samples in ttfts.items():
        if not samples:
            continue
        p99 = _p99(sorted(samples))
        row: dict[str, Any] = {"pooled": label, "requests": len(samples),
                               "p50_ms": statistics.median(samples) * 1000, "p99_ms": p99 * 1000}
        if base_p99 is not None and label != alone:
            row["p99_vs_alone"] = p99 / base_p99
            ratios = sorted(_p99(sorted(rng.choices(samples, k=len(samples))))
                            / _p99(sorted(rng.choices(base, k=len(base)))) for _ in range(draws))
            row["ratio_90pct"] = [ratios[int(0.05 * draws)], ratios[int(0.95 * draws) - 1]]
        rows.append(row)
    return rows


async def start_engine(home: Path, extra: tuple[str, ...]) -> EngineSupervisor:
    shipped = load_policy(ROOT / "policies" / "default.yaml").policy.pools["micro"]
    assert isinstance(shipped, LocalPool)
    spec = shipped.engine.model_copy(update={"base_port": free_port(),
                                             "extra_args": (*shipped.engine.extra_args, *PRIORITY_SCHEDULING, *extra)})
    sup = EngineSupervisor("study-micro", spec, home=home)
    await sup.start()
    return sup


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--rate", type=float, default=4.0, help="interactive requests a second (open loop)")
    p.add_argument("--seconds", type=float, default=30.0, help="length of each phase")
    p.add_argument("--lines", type=int, default=3000, help="lines of each batch (cancelled at the phase's end; "
                   "enough that it is not done by then, else its rate is capped)")
    p.add_argument("--engine-args", default="", help="more vLLM arguments, e.g. '--max-num-seqs 4' (an engine that "
                   "queues)")
    p.add_argument("--lane", default="", help="the lane's bounds, as YAML inside `batches: {...}`, e.g. "
                   "'max_queue: 16, lines_in_flight: 16' (default: the policy's defaults)")
    p.add_argument("--versus", choices=("priority", "preempt"), default="priority", help="what the two gateways "
                   "differ by: `batches.engine_priority` 10 or none (the default), or `batches.preempt` on or off "
                   "(neither with a priority)")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="batch-priority-"))
    models_root(tmp).symlink_to(models_root(), target_is_directory=True)
    loop = asyncio.new_event_loop()
    sup = loop.run_until_complete(start_engine(tmp, tuple(args.engine_args.split())))
    procs = Procs(tmp)
    try:
        registry = tmp / "engines"
        publish(registry, "micro", sup.urls)
        engine = sup.spec.model_dump_json(exclude_defaults=True)
        gateways = {}
        preempting = ", ".join(b for b in (args.lane, "preempt: true") if b)
        pair = ((("priority", 10, args.lane), ("fcfs", None, args.lane)) if args.versus == "priority" else
                (("preempt", None, preempting), ("no-preempt", None, args.lane)))
        (tried, _, _), (base, _, _) = pair
        for name, priority, lane in pair:
            policy = tmp / f"{name}.yaml"
            policy.write_text(study_policy(engine, priority, lane))
            port = free_port()
            cmd, _ = gateway_command(policy, port, "h1", f"study:batch-priority:{uuid.uuid4().hex[:6]}:", "warning",
                                     scorer="length", extra=["--home", str(tmp / name)])
            proc = procs.start(name, cmd, {REGISTRY_ENV: str(registry)})
            gateways[name] = f"http://127.0.0.1:{port}"
            wait_ready(gateways[name] + "/readyz", proc, 300, name, functools.partial(procs.log_tail, name))
        phase(gateways[base], args.rate, 5, 0)  # warm-up
        every: dict[str, list[float]] = {}
        for r in range(args.rounds):
            plan = [("alone", gateways[base], args.rate, 0), ("batch alone", gateways[base], 0.0, args.lines),
                    (f"beside, {base}", gateways[base], args.rate, args.lines),
                    (f"beside, {tried}", gateways[tried], args.rate, args.lines)]
            if r % 2:  # interleaved: the two policies swap places each round
                plan[2], plan[3] = plan[3], plan[2]
            for label, url, rate, lines in plan:
                with open("/proc/loadavg") as f:
                    load = f.read().split()[0]
                figures = phase(url, rate, args.seconds, lines)
                every.setdefault(label, []).extend(figures.pop("ttfts"))
                print(orjson.dumps({"round": r + 1, "phase": label, "load1": float(load),
                                    "at": time.strftime("%H:%M:%S", time.gmtime()), **figures}).decode(), flush=True)
        for row in pooled(every):
            print(orjson.dumps(row).decode(), flush=True)
    finally:
        procs.stop_all()
        loop.run_until_complete(sup.aclose())


if __name__ == "__main__":
    main()
