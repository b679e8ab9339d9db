"""A gateway SIGKILLed mid-batch on a real engine, and another started in its place: does the batch finish with
every line answered once and billed once?

One real demo micro engine (the shipped spec, under a supervisor of this script's, so it outlives the gateways, as
an engine container does) and a gateway in front of it (`--no-engines`, following it through an engine registry;
Redis at `CASCADE_REDIS_URL`, a prefix of this run's). A batch of `--lines` chat lines is created; once a third of
them are answered, the gateway's whole process group is SIGKILLed (lines in flight cut, their claims left
unacknowledged in the stream) and a second gateway with the same policy, home and prefix is started. It takes the
lines nobody took and, after `batches.claim_after_s`, those the dead one held (XAUTOCLAIM). Printed: the lines
answered at the kill, the lines the dead gateway held unacknowledged, the seconds to finish after the restart, and
the checks: each custom_id once in the output, none in the error file, one ledger record per line with distinct
request ids, each carrying the batch id.

    flock /tmp/cascade-engines.lock python -m loadtest.studies.batch_restart --lines 300
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import signal
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import orjson
import redis

from backends.engines.registry import REGISTRY_ENV, publish
from backends.engines.supervisor import EngineSupervisor
from backends.models.demo import models_root
from gateway.batches.queue import GROUP
from gateway.ledger.keys import LedgerKeys
from loadtest.processes import Procs, cleanup_redis, free_port, gateway_command, wait_ready
from loadtest.studies.batch_priority import batch_state, create_batch, start_engine, study_policy

REDIS_URL = os.environ.get("CASCADE_REDIS_URL", "redis://127.0.0.1:6379/0")


def _start(procs: Procs, name: str, policy: Path, home: Path, prefix: str, registry: Path) -> str:
    port = free_port()
    cmd, _ = gateway_command(policy, port, "h1", prefix, "info", scorer="length", extra=["--home", str(home)])
    proc = procs.start(name, cmd, {REGISTRY_ENV: str(registry)})
    url = f"http://127.0.0.1:{port}"
    wait_ready(url + "/readyz", proc, 300, name, functools.partial(procs.log_tail, name))
    return url


def _unacknowledged(prefix: str) -> int:
    """Lines taken by a consumer and not acknowledged, over every batch stream under `prefix` (XPENDING)."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        total = 0
        for key in client.scan_iter(match=f"{prefix}*", _type="stream"):
            total += sum(int(g["pending"]) for g in client.xinfo_groups(key) if g["name"] == GROUP.encode())
        return total
    finally:
        client.close()


def _records(prefix: str, batch_id: str) -> list[dict[str, str]]:
    """The ledger records of the batch's lines (tenant `default`: the study's policy names no tenants)."""
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        entries: list[tuple[str, dict[str, str]]] = client.xrange(LedgerKeys(prefix).stream("default"))  # type: ignore[assignment]
        return [fields for _, fields in entries if fields.get("batch_id") == batch_id]
    finally:
        client.close()


def _checks(client: httpx.Client, url: str, batch_id: str, lines: int, prefix: str) -> dict[str, Any]:
    got = client.get(f"{url}/v1/batches/{batch_id}").json()
    out = client.get(f"{url}/v1/files/{got['output_file_id']}/content").content if got["output_file_id"] else b""
    answers = [orjson.loads(line) for line in out.splitlines()]
    errors = client.get(f"{url}/v1/files/{got['error_file_id']}/content").content if got["error_file_id"] else b""
    ids = Counter(a["custom_id"] for a in answers)
    deadline = time.monotonic() + 30  # the ledger's outbox may still be writing the last records
    while True:
        records = _records(prefix, batch_id)
        if len(records) >= lines or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    billed = Counter(r.get("custom_id") for r in records)
    return {"status": got["status"], "request_counts": got["request_counts"],
            "output_lines": len(answers), "custom_ids_once": ids == Counter({f"l{i}": 1 for i in range(lines)}),
            "all_200": all(a["response"]["status_code"] == 200 for a in answers),
            "error_lines": len(errors.splitlines()), "ledger_records": len(records),
            "billed_once": billed == Counter({f"l{i}": 1 for i in range(lines)}),
            "distinct_request_ids": len({r.get("request_id") for r in records})}


def run(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="batch-restart-"))
    models_root(tmp).symlink_to(models_root(), target_is_directory=True)
    loop = asyncio.new_event_loop()
    sup: EngineSupervisor = loop.run_until_complete(start_engine(tmp, ()))
    procs, prefix = Procs(tmp), f"study:batch-restart:{uuid.uuid4().hex[:6]}:"
    try:
        registry = tmp / "engines"
        publish(registry, "micro", sup.urls)
        policy = tmp / "policy.yaml"
        policy.write_text(study_policy(sup.spec.model_dump_json(exclude_defaults=True), None,
                                  f"claim_after_s: {args.claim_after_s:g}, lines_in_flight: {args.in_flight}"))
        home = tmp / "home"
        first = _start(procs, "first", policy, home, prefix, registry)
        client = httpx.Client(timeout=60)
        batch_id = create_batch(client, first, args.lines)
        started = time.monotonic()
        while (answered := batch_state(client, first, batch_id)[1]) < args.lines // 3:
            time.sleep(0.2)
        os.killpg(procs.pid("first"), signal.SIGKILL)
        killed_at = time.monotonic()
        held = _unacknowledged(prefix)
        procs.stop("first")
        second = _start(procs, "second", policy, home, prefix, registry)
        ready_s = time.monotonic() - killed_at
        while batch_state(client, second, batch_id)[0] not in ("completed", "failed", "expired", "cancelled"):
            if time.monotonic() - killed_at > args.timeout_s:
                break
            time.sleep(0.5)
        finished_s = time.monotonic() - killed_at
        figures = {"lines": args.lines, "claim_after_s": args.claim_after_s, "lines_in_flight": args.in_flight,
                   "answered_before_kill": answered, "seconds_to_kill": round(killed_at - started, 1),
                   "unacknowledged_at_kill": held, "second_ready_s": round(ready_s, 1),
                   "finished_after_kill_s": round(finished_s, 1),
                   **_checks(client, second, batch_id, args.lines, prefix)}
        client.close()
        return figures
    finally:
        procs.stop_all()
        loop.run_until_complete(sup.aclose())
        cleanup_redis(REDIS_URL, prefix)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lines", type=int, default=300, help="lines in the batch")
    p.add_argument("--in-flight", type=int, default=8, help="the lane's lines_in_flight per gateway")
    p.add_argument("--claim-after-s", type=float, default=10.0, help="batches.claim_after_s: when the second "
                   "gateway takes over the lines the killed one held")
    p.add_argument("--timeout-s", type=float, default=600.0, help="give up waiting for the batch after this")
    args = p.parse_args()
    with open("/proc/loadavg") as f:
        load = float(f.read().split()[0])
    print(orjson.dumps({"load1": load, "at": time.strftime("%H:%M:%S", time.gmtime()), **run(args)},
                       option=orjson.OPT_INDENT_2).decode(), flush=True)


if __name__ == "__main__":
    main()
