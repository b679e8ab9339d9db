"""The same surge on the real demo engines twice in one run: the micro pool fixed at one replica, then with
`autoscale: {min_replicas: 1, max_replicas: 2}`. Figures: requests shed (429) and failed per phase, when the
second replica served, and how long after the surge the pool was back to one replica.

    flock /tmp/cascade-engines.lock .venv/bin/python -m loadtest.scenarios autoscale --rate 1.5 --surge-s 150

Each variant starts `cascade serve` with both demo engines (minutes on 2 cores), warms them, runs steady ->
surge -> recover -> after, then (autoscaled) waits for the idle window. The ladder sheds `free` traffic on the
gateway's in-flight count per pool (`--shed-in-flight`), the autoscaler grows the micro pool below that bound
(`--scale-in-flight`), so that it grows before it sheds (`policies.checks`).
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loadtest.load.metrics import samples
from loadtest.processes import Procs, cleanup_redis, http_get
from loadtest.scenarios.checks import flagship_share
from loadtest.scenarios.fake_engines import real_policy, start_gateway

__all__ = ["Surge", "add_autoscale_arguments", "autoscale_scenario"]

Surge = Callable[[str, argparse.Namespace], dict[str, Any]]
"""Runs the surge against a gateway URL and returns its scenario record (`loadtest.scenarios.cli`)."""


def add_autoscale_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scale-in-flight", type=float, default=2.0,
                   help="autoscale: add a micro replica while the gateway has more than this open to it")
    p.add_argument("--sustained-s", type=float, default=5.0, help="autoscale: for this long")
    p.add_argument("--idle-s", type=float, default=30.0, help="autoscale: remove it after this long idle")
    p.add_argument("--recover-s", type=float, default=30.0)
    p.add_argument("--after-s", type=float, default=20.0)


def _block(args: argparse.Namespace) -> str:
    return (f"{{min_replicas: 1, max_replicas: 2, scale_up: {{in_flight: {args.scale_in_flight}, sustained_s: "
            f"{args.sustained_s}}}, scale_down_after_idle_s: {args.idle_s}, cooldown_s: 10}}")


class _ReplicaWatch:
    """Samples the micro pool's replicas and their in-flight counts from /metrics once a second, in a thread."""

    def __init__(self, url: str) -> None:
        self._url = url
        self.timeline: list[tuple[float, dict[str, float]]] = []  # (s since start, replica -> in flight)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.started = time.monotonic()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            try:
                text = http_get(self._url + "/metrics")[1].decode()
            except OSError:
                continue
            row = {labels["replica"]: value for name, labels, value in samples(text)
                   if name == "cascade_replica_in_flight" and labels.get("pool") == "micro"}
            self.timeline.append((round(time.monotonic() - self.started, 1), row))

    def __enter__(self) -> _ReplicaWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def figures(self) -> dict[str, Any]:
        """When the pool first had two replicas, when the second first had a request open, and when it was last
        seen with two (s since the load began)."""
        two = [t for t, row in self.timeline if len(row) >= 2]
        first = self.timeline[0][1] if self.timeline else {}
        serving = [t for t, row in self.timeline if any(v > 0 for r, v in row.items() if r not in first)]
        return {"two_replicas_at_s": two[0] if two else None, "second_served_at_s": serving[0] if serving else None,
                "two_replicas_until_s": two[-1] if two else None,
                "replicas_max": max((len(row) for _, row in self.timeline), default=0)}


def _variant(name: str, args: argparse.Namespace, scaled: bool, tmp: Path, run_surge: Surge) -> dict[str, Any]:
    from loadtest.scenarios.real import _steps, _wait_ladder_idle, warm_up

    (tmp / name).mkdir(parents=True, exist_ok=True)
    procs = Procs(tmp / name)
    try:
        policy = tmp / f"{name}.yaml"
        policy.write_text(real_policy(_steps(args), args.max_num_seqs, _block(args) if scaled else ""))
        print(f"\n##### {name}: starting the gateway with both demo engines ({policy}); this takes minutes",
              flush=True)
        url = start_gateway(procs, policy, None, engines=True, scorer=args.scorer, redis_prefix=args.redis_prefix,
                            ready_timeout_s=args.ready_timeout)
        warm_up(url)
        _wait_ladder_idle(url)
        with _ReplicaWatch(url) as watch:
            record = run_surge(url, args)
            back_at = None
            if scaled:  # the idle window after the load: back to one replica
                deadline = time.monotonic() + args.idle_s + 90
                while time.monotonic() < deadline:
                    if watch.timeline and len(watch.timeline[-1][1]) == 1:
                        back_at = watch.timeline[-1][0]
                        break
                    time.sleep(1)
        record["replicas"] = watch.figures() | {"back_to_one_at_s": back_at}
        print(f"  replicas: {record['replicas']}", flush=True)
        return record
    finally:
        procs.stop_all()
        cleanup_redis(args.redis_url, args.redis_prefix)


def autoscale_scenario(args: argparse.Namespace, run_surge: Surge) -> dict[str, Any]:
    """Both variants, one after the other; the record holds each one's surge and replica figures."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="scenario-autoscale-") as tmp:
        fixed = _variant("fixed", args, False, Path(tmp), run_surge)
        scaled = _variant("autoscaled", args, True, Path(tmp), run_surge)
    rows = []
    for name, rec in (("fixed", fixed), ("autoscaled", scaled)):
        for phase, s in rec["summary"]["phases"].items():
            share = flagship_share(s)
            rows.append((name, phase, s["sent"], s["ok"], s["rejected_429"], s["classes"].get("5xx", 0),
                         "-" if share is None else f"{share:.0%}"))
    print("\n=== fixed vs autoscaled micro pool, same surge")
    print(f"{'variant':<12}{'phase':<10}{'sent':>6}{'ok':>6}{'429':>6}{'5xx':>6}{'flagship':>10}")
    for row in rows:
        print(f"{row[0]:<12}{row[1]:<10}{row[2]:>6}{row[3]:>6}{row[4]:>6}{row[5]:>6}{row[6]:>10}")
    print(f"autoscaled replicas: {scaled['replicas']}")
    return {"fixed": fixed, "autoscaled": scaled}
