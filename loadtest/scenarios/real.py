"""The scenarios on the real demo engines: one `cascade serve` start (both local vLLM engines, the trained
classifier), then the surge, the routed mix against all-flagship, and the engine directly / through the
gateway / through LiteLLM side by side. Serialize with other engine users: `flock /tmp/cascade-engines.lock`."""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loadtest.bench.peers import PeerTarget, format_side_by_side, side_by_side, start_litellm
from loadtest.load.generator import LoadConfig, TenantKey, run_load
from loadtest.load.metrics import active_steps, counter_sum, samples
from loadtest.load.phases import Phase
from loadtest.load.prompt_mix import parse_mix
from loadtest.processes import Procs, cleanup_redis, http_get
from loadtest.scenarios.checks import ROUTED_MODEL, format_checks, routing_checks
from loadtest.scenarios.fake_engines import GOLD_KEY, ShedStep, real_policy, start_gateway

__all__ = ["add_real_arguments", "engine_url", "real_load", "real_suite", "routing_comparison", "warm_up"]


def add_real_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scorer", choices=["classifier", "length", "none"], default="classifier")
    p.add_argument("--shed-ttft-s", type=float, default=0.5,
                   help="ladder: shed priority < 1 while a pool's p95 TTFT is above this (exit at half)")
    p.add_argument("--shed-queue", type=float, default=None, metavar="N",
                   help="ladder: shed on the engines' waiting queue instead (> N, exit below N/4): it sees a "
                   "backlog at once, where p95 TTFT of finished requests lags it; use with --max-num-seqs")
    p.add_argument("--shed-in-flight", default=None, metavar="N[,M]",
                   help="ladder: shed on the gateway's own open requests per pool instead (micro > N, flagship > "
                   "M, default M = N; exit below a quarter): arrival rate x latency, so it also sees engines "
                   "slowed by a shared CPU")
    p.add_argument("--shed-hold-s", type=float, default=10.0,
                   help="ladder: a shed step stays engaged at least this long (hysteresis: shed at once, let "
                   "traffic back only once the surge has been over for a while)")
    p.add_argument("--max-num-seqs", type=int, default=None,
                   help="vLLM batch cap of both engines, so that a surge queues (shows in queue_depth)")
    p.add_argument("--ready-timeout", type=float, default=900.0, help="seconds to wait for the engines")
    p.add_argument("--routing-rate", type=float, default=1.5, help="routed vs all-flagship: requests/s")
    p.add_argument("--routing-s", type=float, default=30.0, help="routed vs all-flagship: seconds per run")
    p.add_argument("--peer-concurrency", type=int, default=8)
    p.add_argument("--peer-s", type=float, default=15.0, help="side by side: seconds per cell")
    p.add_argument("--peer-rounds", type=int, default=2)
    p.add_argument("--litellm-venv", type=Path, default=Path("/tmp/litellm-venv"))


def _steps(args: argparse.Namespace) -> list[ShedStep]:
    """One shed step per pool on the chosen signal: (micro, flagship) thresholds, exit at a fraction of them."""
    if args.shed_in_flight is not None:
        limits = [float(x) for x in str(args.shed_in_flight).split(",")]
        suffix, signal, enter, exit_share = "busy", "in_flight", (limits[0], limits[-1]), 1 / 4
    elif args.shed_queue is not None:
        suffix, signal, enter, exit_share = "queue", "queue_depth", (args.shed_queue, args.shed_queue), 1 / 4
    else:
        suffix, signal, enter, exit_share = "slow", "ttft_p95_s", (args.shed_ttft_s, args.shed_ttft_s), 1 / 2
    return [ShedStep(f"{pool}-{suffix}-shed", signal, pool, enter=n, exit=n * exit_share, hold_s=args.shed_hold_s,
                     retry_after_s=5) for pool, n in zip(("micro", "flagship"), enter, strict=True)]


def engine_url(gateway: str, pool: str) -> str:
    """The first replica of `pool`, as the gateway's /metrics names it."""
    _, body = http_get(gateway + "/metrics")
    for name, labels, _ in samples(body.decode()):
        if name == "cascade_replica_in_flight" and labels.get("pool") == pool:
            return str(labels["replica"])
    raise RuntimeError(f"no replica of pool {pool} in {gateway}/metrics")


def routing_comparison(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """The same prompts at the same arrival times with model `auto`, then pinned to the flagship pool;
    cost is the difference of the gateway's `cascade_cost_micro_usd` counter over each run."""
    rows = []
    for model in ("auto", "flagship"):
        before = http_get(url + "/metrics")[1].decode()
        config = LoadConfig(base_url=url, model=model, phases=[Phase(model, args.routing_s, args.routing_rate,
                                                                     args.routing_rate)],
                            mix=parse_mix(args.mix), tenants=[TenantKey("gold", GOLD_KEY)], max_tokens=args.max_tokens,
                            seed=args.seed, progress=not args.quiet, label=f"routing-{model}")
        s = asyncio.run(run_load(config)).summary()["overall"]
        after = http_get(url + "/metrics")[1].decode()
        cost = counter_sum(after, "cascade_cost_micro_usd") - counter_sum(before, "cascade_cost_micro_usd")
        rows.append({"model": model, "ok": s["ok"], "errors": s["sent"] - s["ok"], "pool_share": s["pool_share"],
                     "cost_micro_usd": int(cost),
                     "micro_usd_per_request": round(cost / s["ok"], 1) if s["ok"] else None,
                     "ttft_ms": s["ttft_ms"], "e2e_ms": s["e2e_ms"], "tokens_per_s": s["tokens_per_s"]})
    auto, flag = rows
    saving = 1 - auto["cost_micro_usd"] / flag["cost_micro_usd"] if flag["cost_micro_usd"] else None
    share = auto["pool_share"].get("flagship", 0.0) if auto["ok"] else None
    print(f"\n=== routed mix vs all-flagship ({args.routing_s:g} s at {args.routing_rate:g} req/s each, same prompts)")
    print(f"{'model':<10}{'ok':>5}{'err':>5}{'µUSD':>9}{'µUSD/req':>10}{'TTFT p50/p99 ms':>18}{'e2e p50/p99 ms':>17}"
          "  pools")
    for r in rows:
        pools = " ".join(f"{p}={v:.0%}" for p, v in r["pool_share"].items())
        print(f"{r['model']:<10}{r['ok']:>5}{r['errors']:>5}{r['cost_micro_usd']:>9}"
              f"{r['micro_usd_per_request'] or 0:>10}"
              f"{_pair(r['ttft_ms']):>18}{_pair(r['e2e_ms']):>17}  {pools}")
    if saving is not None:
        print(f"  the routed mix (flagship share {share or 0:.0%}) cost {saving:.0%} less than all-flagship")
    checks = routing_checks({"phases": {"routed mix": {"ok": auto["ok"], "pool_share": auto["pool_share"]}}},
                            ROUTED_MODEL)
    print(format_checks(checks))
    return {"rows": rows, "saving_fraction": saving, "flagship_share": share, "checks": [c.to_json() for c in checks]}


def _pair(p: dict[str, float | None]) -> str:
    return f"{p['p50'] or 0:.0f} / {p['p99'] or 0:.0f}"


def _gateway(procs: Procs, tmp: Path, args: argparse.Namespace) -> str:
    policy = tmp / "policy.yaml"
    policy.write_text(real_policy(_steps(args), args.max_num_seqs))
    print(f"starting the gateway with both demo engines (policy {policy}); this takes minutes", flush=True)
    url = start_gateway(procs, policy, None, engines=True, scorer=args.scorer, redis_prefix=args.redis_prefix,
                        ready_timeout_s=args.ready_timeout)
    warm_up(url)
    _wait_ladder_idle(url)
    return url


def warm_up(url: str) -> None:
    """The first requests pay one-off compile and cache costs; then a light trickle to both pools refreshes the
    gateway's 30 s TTFT window (a step whose pool gets no traffic keeps its last state)."""
    warm = LoadConfig(base_url=url, model="auto", phases=[Phase("warm", 15, 4, 4), Phase("settle", 35, 1, 1)],
                      mode="closed", mix=parse_mix("short-easy:1,short-hard:1,long-hard:1"),
                      tenants=[TenantKey("gold", GOLD_KEY)], progress=False, label="warm-up")
    asyncio.run(run_load(warm))


def _wait_ladder_idle(url: str, timeout_s: float = 90.0) -> None:
    """Wait until no ladder step is active: the slow first requests of the warm-up stay in the gateway's
    30 s TTFT window and would make the steady phase start degraded."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        active = active_steps(http_get(url + "/metrics")[1].decode())
        if not active:
            return
        time.sleep(1)
    print(f"warning: ladder steps still active after {timeout_s:.0f} s: {active}", flush=True)


LoadScenario = Callable[[str, argparse.Namespace, bool], dict[str, Any]]
"""Runs the steady (False) or surge (True) scenario against a gateway URL (`loadtest.scenarios.cli` passes its own)."""


def real_load(args: argparse.Namespace, surge: bool, load_scenario: LoadScenario) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="scenario-real-") as tmp:
        procs = Procs(Path(tmp))
        try:
            return load_scenario(_gateway(procs, Path(tmp), args), args, surge)
        finally:
            procs.stop_all()
            cleanup_redis(args.redis_url, args.redis_prefix)


def real_suite(args: argparse.Namespace, load_scenario: LoadScenario) -> dict[str, Any]:
    record: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="scenario-real-") as tmp:
        procs = Procs(Path(tmp))
        try:
            url = _gateway(procs, Path(tmp), args)
            record["surge"] = load_scenario(url, args, True)
            record["routing"] = routing_comparison(url, args)
            direct = engine_url(url, "micro")
            targets = [PeerTarget("direct", direct, "micro"), PeerTarget("gateway", url, "micro", GOLD_KEY)]
            try:
                targets.append(start_litellm(procs, args.litellm_venv, direct, "micro", Path(tmp)))
            except RuntimeError as exc:
                print(f"LiteLLM skipped: {exc}")
                record["litellm_error"] = str(exc)
            print(f"\n=== side by side: the micro engine directly, through the gateway and through LiteLLM "
                  f"(closed loop c={args.peer_concurrency}, {args.peer_rounds} rounds x {args.peer_s:g} s; "
                  "model micro: pinned, flagship share 0% by design)")
            peers = asyncio.run(side_by_side(targets, args.peer_concurrency, args.peer_s, args.peer_rounds,
                                             args.max_tokens))
            print(format_side_by_side(peers))
            record["side_by_side"] = peers
        finally:
            procs.stop_all()
            cleanup_redis(args.redis_url, args.redis_prefix)
    record["checks"] = record["surge"]["checks"] + record["routing"]["checks"]
    return record
