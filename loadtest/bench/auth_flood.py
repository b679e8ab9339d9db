"""What a flood of distinct invalid API keys costs valid clients: their p50/p99 with and without the flood, side by
side, on a gateway with the failed-authentication limit (the default) and on one without it (a burst no flood
reaches), both in front of one fake upstream, with the real Redis key store.

Valid clients (`--valid-concurrency` closed loops, half on a policy key, half on an issued key that the gateway
looks up in Redis every 0.5 s) send from 127.0.0.1; the flood (`--flood-keys` distinct invalid keys spread evenly
over `--seconds`, from another process) sends from 127.0.0.2, another client address. Cells alternate quiet and
flood per gateway. Run timing under the machine-wide lock:

    flock /tmp/cascade-engines.lock .venv/bin/python -m loadtest.bench.auth_flood --seconds 60
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from loadtest.processes import Env, Procs, cleanup_redis, free_port, gateway_command, policy_text, wait_ready

ADMIN = "bench-admin-key"
POLICY_KEY = "sk-bench-policy"
BODY = {"model": "micro", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}


def _policy(upstream: str) -> str:
    digest = hashlib.sha256(POLICY_KEY.encode()).hexdigest()
    tenants = f"tenants:\n  acme: {{api_key_sha256: ['{digest}']}}\n"
    return policy_text(upstream, "fake-model", upstream, "fake-model") + tenants


def _start_gateway(env: Env, name: str, upstream: str, burst: int) -> str:
    policy = env.tmp / f"{name}.yaml"
    policy.write_text(_policy(upstream))
    port = free_port()
    cmd, _ = gateway_command(policy, port, "aiohttp", env.prefix + name + ":", "warning", "redis",
                             extra=["--access-log", "off"])
    extra = {"CASCADE_HOME": str(env.tmp / f"{name}-home"), "CASCADE_REDIS_URL": env.args.redis_url,
             "CASCADE_ADMIN_KEY": ADMIN, "CASCADE_AUTH_FAILURE_BURST": str(burst)}
    proc = env.procs.start(name, cmd, extra)
    base = f"http://127.0.0.1:{port}"
    wait_ready(base + "/readyz", proc, 120, f"gateway {name}", lambda: env.procs.log_tail(name))
    return base


async def _valid_clients(base: str, keys: list[str], concurrency: int, seconds: float) -> list[float]:
    """Latencies (ms) of the valid clients' requests over `seconds`; every one must be answered 200."""
    latencies: list[float] = []
    deadline = time.monotonic() + seconds
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        async def loop(i: int) -> None:
            headers = {"authorization": f"Bearer {keys[i % len(keys)]}"}
            while time.monotonic() < deadline:
                start = time.perf_counter()
                reply = await client.post("/v1/chat/completions", json=BODY, headers=headers)
                latencies.append((time.perf_counter() - start) * 1000)
                if reply.status_code != 200:
                    raise RuntimeError(f"a valid client got {reply.status_code}: {reply.text[:200]}")
        await asyncio.gather(*(loop(i) for i in range(concurrency)))
    return latencies


async def flood(base: str, count: int, seconds: float, tag: str) -> dict[str, int]:
    """`count` distinct invalid keys spread evenly over `seconds` from 127.0.0.2; answers by status."""
    statuses: Counter[str] = Counter()
    transport = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
    async with httpx.AsyncClient(base_url=base, timeout=30, transport=transport) as client:
        async def one(i: int) -> None:
            try:
                reply = await client.post("/v1/chat/completions", json=BODY,
                                          headers={"authorization": f"Bearer sk-flood-{tag}-{i}"})
                statuses[str(reply.status_code)] += 1
            except httpx.HTTPError as exc:
                statuses[type(exc).__name__] += 1
        start, tasks = time.monotonic(), []
        for i in range(count):
            await asyncio.sleep(max(0.0, start + i * seconds / count - time.monotonic()))
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.gather(*tasks)
    return dict(statuses)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def _cell(base: str, keys: list[str], args: argparse.Namespace, flooded: bool, tag: str) -> dict[str, Any]:
    proc = None
    if flooded:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "loadtest.bench.auth_flood", "--flood", base, "--flood-keys", str(args.flood_keys),
            "--seconds", str(args.seconds), "--tag", tag, stdout=asyncio.subprocess.PIPE)
    latencies = await _valid_clients(base, keys, args.valid_concurrency, args.seconds)
    answers = json.loads((await proc.communicate())[0]) if proc is not None else {}
    return {"requests": len(latencies), "p50_ms": round(_pct(latencies, 0.5), 2),
            "p99_ms": round(_pct(latencies, 0.99), 2), "flood_answers": answers}


async def _issued_key(base: str) -> str:
    async with httpx.AsyncClient(base_url=base, timeout=10) as client:
        made = await client.post("/admin/keys", json={"tenant": "acme", "name": "bench"},
                                 headers={"authorization": f"Bearer {ADMIN}"})
        made.raise_for_status()
        return str(made.json()["key"])


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    tmp = Path(tempfile.mkdtemp(prefix="auth-flood-"))
    env = Env(args, tmp, Procs(tmp), f"bench:authflood:{uuid.uuid4().hex[:6]}:")
    rows: list[dict[str, Any]] = []
    try:
        port = free_port()
        upstream = f"http://127.0.0.1:{port}"
        up = env.procs.start("upstream", [sys.executable, "-m", "loadtest.fake_upstream", "--port", str(port),
                                          "--model", "fake-model"])
        wait_ready(upstream + "/health", up, 60, "fake upstream", lambda: env.procs.log_tail("upstream"))
        gateways = {"limited (burst 20)": _start_gateway(env, "limited", upstream, 20),
                    "unlimited": _start_gateway(env, "unlimited", upstream, 10**9)}
        for rnd in range(args.rounds):
            for name, base in gateways.items():
                keys = [POLICY_KEY, await _issued_key(base)]
                for flooded in (False, True):
                    row = await _cell(base, keys, args, flooded, f"{rnd}{name[:3]}")
                    rows.append({"round": rnd, "gateway": name, "flood": flooded, **row})
                    print(json.dumps(rows[-1]), flush=True)
    finally:
        env.procs.stop_all()
        cleanup_redis(args.redis_url, env.prefix)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--flood-keys", type=int, default=10_000)
    parser.add_argument("--valid-concurrency", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--redis-url", default=os.environ.get("CASCADE_REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--flood", help=argparse.SUPPRESS)  # the flood process: its gateway's base URL
    parser.add_argument("--tag", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.flood:
        print(json.dumps(asyncio.run(flood(args.flood, args.flood_keys, args.seconds, args.tag))))
        return
    rows = asyncio.run(run(args))
    rate = f"{args.flood_keys:,} keys in {args.seconds:g} s"
    print("\n| gateway | flood | valid requests | p50 ms | p99 ms | flood answers |\n|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['gateway']} | {rate if row['flood'] else 'none'} | {row['requests']} | "
              f"{row['p50_ms']} | {row['p99_ms']} | {row['flood_answers'] or '-'} |")


if __name__ == "__main__":
    main()
