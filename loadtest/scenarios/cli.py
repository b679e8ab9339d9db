"""Load scenarios of the serving path under traffic, each printing its figures, whether the degradation ladder
engaged, and the targets it checks. Run `python -m loadtest.scenarios --help`.

- `steady`, `surge` (5x the steady rate for 30 s, then 30 s to recover and a 20 s window to compare with
  steady state), on fake engines (`--backend fake`: engines with a fixed capacity, so a queue builds) or
  on the real demo engines (`--backend real`: `cascade serve` starting both local vLLM engines);
- `slow-engine`, `dead-replica`: fake engines served in this process, because the scenario must slow one
  replica down or kill it mid-run and bring it back, which real engines do not offer on demand (their
  mechanics in the gateway, probing, breakers and load-aware choice, are the same for both);
- `real`: one start of the real engines for the headline figures: the surge with model `auto` and a
  gold/free tenant mix, the routed mix against all-flagship (cost from the gateway's /metrics, latency),
  and the engine directly, through the gateway and through LiteLLM side by side (`loadtest.bench.peers`);
- `chaos`: a real demo engine made to hang, a remote pool made unreachable and Redis stopped and started again,
  in turn and overlapping, under steady load (`loadtest.scenarios.chaos`).

Real engines take minutes and ~3 GB each to start; on a shared machine serialize them:
`flock /tmp/cascade-engines.lock python -m loadtest.scenarios real`.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from loadtest.fake_upstream import FakeUpstream
from loadtest.load.generator import RESULTS_DIR, LoadConfig, LoadRun, TenantKey, format_summary, run_load, write_results
from loadtest.load.phases import Phase
from loadtest.load.prompt_mix import DEFAULT_MIX, parse_mix
from loadtest.processes import Procs, cleanup_redis
from loadtest.scenarios.checks import ROUTED_MODEL, Check, flagship_share, format_checks, routing_checks, surge_checks
from loadtest.scenarios.fake_engines import FREE_KEY, GOLD_KEY, InProcessServer, ShedStep, fake_policy, start_gateway

__all__ = ["build_parser", "ladder_spans", "main", "run_scenario", "surge_phases"]

Hook = tuple[float, Callable[[], None]]  # (seconds from the start, what to do then)


def surge_phases(rate: float, factor: float = 5.0, steady_s: float = 30, surge_s: float = 30, recover_s: float = 30,
                 after_s: float = 20) -> list[Phase]:
    """steady → surge (factor x rate) → recover (the 30 s allowed to get back) → after (compared with steady)."""
    return [Phase("steady", steady_s, rate, rate), Phase("surge", surge_s, rate * factor, rate * factor),
            Phase("recover", recover_s, rate, rate), Phase("after", after_s, rate, rate)]


def ladder_spans(timeline: list[tuple[float, list[str]]]) -> list[dict[str, Any]]:
    """(step, engaged at s, released at s or None) from a /metrics timeline."""
    spans: list[dict[str, Any]] = []
    open_: dict[str, dict[str, Any]] = {}
    for t, steps in timeline:
        for step in steps:
            if step not in open_:
                open_[step] = {"step": step, "engaged_s": t, "released_s": None}
                spans.append(open_[step])
        for step in [s for s in open_ if s not in steps]:
            open_.pop(step)["released_s"] = t
    return spans


async def _with_hooks(config: LoadConfig, hooks: list[Hook]) -> LoadRun:
    async def fire() -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        for at, action in hooks:
            await asyncio.sleep(max(0.0, start + at - loop.time()))
            action()

    task = asyncio.create_task(fire())
    try:
        return await run_load(config)
    finally:
        task.cancel()


def run_scenario(name: str, config: LoadConfig, out: Path, hooks: list[Hook] | None = None,
                 checks: Callable[[dict[str, Any]], list[Check]] | None = None) -> dict[str, Any]:
    """Run one load, print its figures, ladder and checks; write JSON + PNG; return the scenario's record."""
    print(f"\n=== {name}: {config.chat_url} model={config.model} " +
          ", ".join(f"{p.name} {p.duration_s:g}s@{p.start:g}" for p in config.phases), flush=True)
    run = asyncio.run(_with_hooks(config, hooks or []))
    summary = run.summary()
    print(format_summary(summary))
    spans = ladder_spans(run.ladder.timeline) if run.ladder else []
    for span in spans:
        released = "still engaged at the end" if span["released_s"] is None else f"released at {span['released_s']}s"
        print(f"  ladder: {span['step']} engaged at {span['engaged_s']}s, {released}")
    if run.ladder is not None:
        print(f"  ladder engaged: {'yes' if spans else 'no'}; degraded responses: "
              f"{summary['overall']['degraded_responses']}")
    shares = ", ".join(f"{phase} {_share(s)}" for phase, s in summary["phases"].items())
    print(f"  realised flagship share: {shares}" + ("" if config.model == ROUTED_MODEL else
                                                    f" (model {config.model}: pinned, not routed)"))
    found = (checks(summary) if checks else []) + routing_checks(summary, config.model)
    if found:
        print(format_checks(found))
    json_path, png = write_results(run, out, f"{name}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}")
    print(f"  results: {json_path}  plot: {png}", flush=True)
    return {"scenario": name, "summary": summary, "ladder": spans, "checks": [c.to_json() for c in found],
            "files": [str(json_path), str(png)]}


def _share(phase: dict[str, Any]) -> str:
    share = flagship_share(phase)
    return "-" if share is None else f"{share:.0%}"


def _tenants() -> list[TenantKey]:
    return [TenantKey("gold", GOLD_KEY, 1.0), TenantKey("free", FREE_KEY, 3.0)]


def _config(url: str, model: str, phases: list[Phase], args: argparse.Namespace, label: str,
            tenants: list[TenantKey] | None = None) -> LoadConfig:
    return LoadConfig(base_url=url, model=model, phases=phases, mix=parse_mix(args.mix), tenants=tenants or _tenants(),
                      max_tokens=args.max_tokens, seed=args.seed, metrics_url=url + "/metrics", label=label,
                      progress=not args.quiet)


# --------------------------------------------------------------------------------------- fake backends

class FakeBackend:
    """Fake engines in this process (micro: two replicas, flagship: one) and a gateway process before them."""

    def __init__(self, stack: ExitStack, procs: Procs, tmp: Path, args: argparse.Namespace,
                 steps: list[ShedStep]) -> None:
        def engine(model: str) -> InProcessServer:
            app = FakeUpstream(model, delay_ms=args.fake_delay_ms, max_running=args.fake_capacity)
            return stack.enter_context(InProcessServer(app))

        self.micro = [engine("micro-model"), engine("micro-model")]
        self.flagship = engine("flagship-model")
        policy = tmp / "policy.yaml"
        policy.write_text(fake_policy([s.url for s in self.micro], [self.flagship.url], steps))
        self.url = start_gateway(procs, policy, tmp / "home", engines=False, scorer="length",
                                 redis_prefix=args.redis_prefix, ready_timeout_s=60)


def _fake_steps(args: argparse.Namespace) -> list[ShedStep]:
    q = args.fake_capacity
    return [ShedStep(f"{pool}-queue-shed", "queue_depth", pool, enter=q, exit=max(1, q // 4), hold_s=5)
            for pool in ("micro", "flagship")]


def _fake_scenario(args: argparse.Namespace, body: Callable[[FakeBackend, Path], dict[str, Any]]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="scenario-") as tmp, ExitStack() as stack:
        procs = Procs(Path(tmp))
        try:
            backend = FakeBackend(stack, procs, Path(tmp), args, _fake_steps(args))
            return body(backend, Path(tmp))
        finally:
            procs.stop_all()
            cleanup_redis(args.redis_url, args.redis_prefix)


def _replica_shares(backend: FakeBackend, counts: list[tuple[str, list[int]]]) -> dict[str, list[int]]:
    """Requests per micro replica in each phase, from the fakes' counters read at phase boundaries."""
    out: dict[str, list[int]] = {}
    for (name, now), (_, before) in zip(counts[1:], counts[:-1], strict=True):
        out[name] = [a - b for a, b in zip(now, before, strict=True)]
    return out


def _mechanics(args: argparse.Namespace, name: str, change: Callable[[FakeBackend], tuple[Callable[[], None],
               Callable[[], None]]]) -> dict[str, Any]:
    """before → changed (one micro replica slowed or killed) → restored; model pinned to the micro pool."""
    d = args.phase_s
    phases = [Phase("before", d, args.rate, args.rate), Phase(name, d, args.rate, args.rate),
              Phase("restored", d, args.rate, args.rate)]

    def body(backend: FakeBackend, _tmp: Path) -> dict[str, Any]:
        spoil, mend = change(backend)
        counts: list[tuple[str, list[int]]] = []

        def mark(label: str, then: Callable[[], None] | None = None) -> Callable[[], None]:
            def act() -> None:
                counts.append((label, [s.app.requests for s in backend.micro]))
                if then:
                    then()
            return act

        hooks: list[Hook] = [(0.0, mark("start")), (d, mark("before", spoil)), (2 * d, mark(name, mend)),
                             (3 * d, mark("restored"))]
        record = run_scenario(name, _config(backend.url, "micro", phases, args, name), args.out, hooks,
                              checks=lambda s: [Check("no 5xx from the gateway", s["overall"]["classes"].get("5xx", 0)
                                                      == 0, f"{s['overall']['classes']}")])
        record["micro_replica_requests"] = _replica_shares(backend, counts)
        print(f"  requests per micro replica (A, B) by phase: {record['micro_replica_requests']}")
        return record

    return _fake_scenario(args, body)


def slow_engine(args: argparse.Namespace) -> dict[str, Any]:
    def change(b: FakeBackend) -> tuple[Callable[[], None], Callable[[], None]]:
        slow = b.micro[1].app

        def spoil() -> None:
            slow.delay_ms = args.fake_delay_ms * args.slow_factor

        def mend() -> None:
            slow.delay_ms = args.fake_delay_ms
        return spoil, mend
    return _mechanics(args, "slow-engine", change)


def dead_replica(args: argparse.Namespace) -> dict[str, Any]:
    def change(b: FakeBackend) -> tuple[Callable[[], None], Callable[[], None]]:
        victim = b.micro[1]

        def revive() -> None:
            victim.start()
        return victim.kill, revive
    return _mechanics(args, "dead-replica", change)


def fake_load(args: argparse.Namespace, surge: bool) -> dict[str, Any]:
    def body(backend: FakeBackend, _tmp: Path) -> dict[str, Any]:
        return _load_scenario(backend.url, args, surge)
    return _fake_scenario(args, body)


def _load_scenario(url: str, args: argparse.Namespace, surge: bool) -> dict[str, Any]:
    if surge:
        phases = surge_phases(args.rate, args.factor, args.steady_s, args.surge_s, 30, 20)
        return run_scenario("surge", _config(url, args.model, phases, args, "surge"), args.out, checks=surge_checks)
    phases = [Phase("steady", args.steady_s, args.rate, args.rate)]
    return run_scenario("steady", _config(url, args.model, phases, args, "steady"), args.out)


# --------------------------------------------------------------------------------------------- CLI

def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rate", type=float, default=2.0, help="steady arrival rate, requests/s")
    p.add_argument("--model", default="auto")
    p.add_argument("--mix", default=DEFAULT_MIX)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=RESULTS_DIR)
    p.add_argument("--quiet", action="store_true", help="no live progress line")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    p.add_argument("--redis-prefix", default=f"loadtest:{uuid.uuid4().hex[:8]}:",
                   help="ledger key prefix of the gateways started here (deleted afterwards)")
    p.add_argument("--fake-delay-ms", type=float, default=20.0, help="fake engines: ms per streamed token")
    p.add_argument("--fake-capacity", type=int, default=2, help="fake engines: requests served at once")


def build_parser() -> argparse.ArgumentParser:
    from loadtest.scenarios.autoscale import add_autoscale_arguments
    from loadtest.scenarios.chaos import add_chaos_arguments
    from loadtest.scenarios.real import add_real_arguments

    p = argparse.ArgumentParser(prog="python -m loadtest.scenarios", description=__doc__.split("\n\n")[0]
                                if __doc__ else None, formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1] if __doc__ else None)
    sub = p.add_subparsers(dest="scenario", required=True)
    for name, text in (("steady", "steady load"), ("surge", "steady, 5x surge for 30 s, recovery")):
        s = sub.add_parser(name, help=text, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        _common(s)
        s.add_argument("--backend", choices=["fake", "real"], default="fake")
        s.add_argument("--factor", type=float, default=5.0, help="surge rate = factor x steady rate")
        s.add_argument("--steady-s", type=float, default=30.0)
        s.add_argument("--surge-s", type=float, default=30.0)
        add_real_arguments(s)
    for name, text in (("slow-engine", "one micro replica becomes slow, then recovers (fake engines)"),
                       ("dead-replica", "one micro replica dies, then comes back (fake engines)")):
        s = sub.add_parser(name, help=text, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        _common(s)
        s.add_argument("--phase-s", type=float, default=20.0, help="seconds per phase (before, changed, restored)")
        s.add_argument("--slow-factor", type=float, default=20.0, help="slow replica: this many times slower")
    r = sub.add_parser("real", help="headline figures on the real demo engines (one engine start)",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    _common(r)
    r.add_argument("--factor", type=float, default=5.0)
    r.add_argument("--steady-s", type=float, default=30.0)
    r.add_argument("--surge-s", type=float, default=30.0)
    add_real_arguments(r)
    a = sub.add_parser("autoscale", help="the same surge on the real demo engines, micro fixed at one replica, "
                       "then autoscaled to two (two engine starts)",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    _common(a)
    a.add_argument("--factor", type=float, default=5.0)
    a.add_argument("--steady-s", type=float, default=30.0)
    a.add_argument("--surge-s", type=float, default=150.0, help="long enough for a second engine to start")
    add_real_arguments(a)
    add_autoscale_arguments(a)
    c = sub.add_parser("chaos", help="an engine hangs, a remote pool and Redis go away, under load (one real engine)",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    _common(c)
    add_chaos_arguments(c)
    return p


def main(argv: list[str] | None = None) -> int:
    from loadtest.scenarios.real import real_load, real_suite

    args = build_parser().parse_args(argv)
    if args.scenario in ("steady", "surge"):
        surge = args.scenario == "surge"
        record = real_load(args, surge, _load_scenario) if args.backend == "real" else fake_load(args, surge)
    elif args.scenario == "chaos":
        from loadtest.scenarios.chaos import chaos_scenario

        record = chaos_scenario(args)
    elif args.scenario == "real":
        record = real_suite(args, _load_scenario)
    elif args.scenario == "autoscale":
        from loadtest.scenarios.autoscale import autoscale_scenario

        def surge(url: str, args: argparse.Namespace) -> dict[str, Any]:
            phases = surge_phases(args.rate, args.factor, args.steady_s, args.surge_s, args.recover_s, args.after_s)
            return run_scenario("surge", _config(url, args.model, phases, args, "surge"), args.out)

        record = autoscale_scenario(args, surge)
        record["checks"] = record["fixed"]["checks"] + record["autoscaled"]["checks"]
    else:
        record = slow_engine(args) if args.scenario == "slow-engine" else dead_replica(args)
    path = args.out / f"scenario-{args.scenario}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(record, option=orjson.OPT_INDENT_2, default=str))
    print(f"\nscenario record: {path}")
    failed = [c for c in record.get("checks", []) if c["ok"] is False]
    for check in failed:
        print(f"FAILED: {check['name']}: {check['detail']}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
