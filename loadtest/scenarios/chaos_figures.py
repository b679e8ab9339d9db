"""Figures and checks of a chaos run (`loadtest.scenarios.chaos`): what the client saw, the ledger against the
completed requests, `/readyz` over time with the reason of each 503, the engine restarts `/metrics` counts,
and the invariants a run must keep."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import redis
import redis.asyncio as aioredis

from gateway.costs.report import verify
from gateway.ledger.keys import LedgerKeys
from gateway.ledger.layouts import stream_names
from loadtest.load.client import Sample
from loadtest.load.metrics import samples as metric_samples
from loadtest.processes import http_get
from loadtest.scenarios.checks import Check

__all__ = ["PREFIX", "check_invariants", "client_view", "compare_ledger", "engine_restarts", "format_record",
           "ledger_records", "micro_in_flight", "readiness", "state", "supervisor_lines"]

PREFIX = "chaos:"  # the ledger's key prefix; the private Redis holds nothing else


def ledger_records(url: str, prefix: str = PREFIX) -> list[dict[str, str]]:
    """Every cost record in the ledger streams under `prefix` (the chaos tests' own prefixes use it too)."""
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        keys = LedgerKeys(prefix)
        tenants: set[str] = client.smembers(keys.tenants)  # type: ignore[assignment]
        entries: list[tuple[str, dict[str, str]]] = [
            entry for stream in stream_names(keys, tenants) for entry in client.xrange(stream)]  # type: ignore[misc, union-attr]
        return [fields for _, fields in entries]
    finally:
        client.close()


async def compare_ledger(redis_url: str, completed: dict[str, Sample], settle_s: float) -> dict[str, Any]:
    """Wait (up to `settle_s`) for a record of every completed request (the outbox replays after an outage),
    then compare: records by status, completed without a record, recorded twice, tokens, rollups."""
    waited = time.monotonic()
    while True:
        records = await asyncio.to_thread(ledger_records, redis_url)
        ok = {r["request_id"]: r for r in records if r["status"] == "ok"}
        if ok.keys() >= completed.keys() or time.monotonic() - waited > settle_s:
            break
        await asyncio.sleep(0.5)
    ids = Counter(r["request_id"] for r in records)
    wrong_tokens = [rid for rid, s in completed.items() if rid in ok and (int(ok[rid]["prompt_tokens"]),
                    int(ok[rid]["completion_tokens"])) != (s.prompt_tokens, s.completion_tokens)]
    client = aioredis.Redis.from_url(redis_url)
    try:
        today = datetime.now(UTC).date()
        rollups = await verify(client, LedgerKeys(PREFIX), today - timedelta(days=1), today)
    finally:
        await client.aclose()
    return {"records": len(records), "by_status": dict(Counter(r["status"] for r in records)),
            "completed": len(completed), "lost": sorted(completed.keys() - ok.keys()),
            "ok_not_completed": sorted(ok.keys() - completed.keys()),
            "twice": [i for i, n in ids.items() if n > 1], "wrong_tokens": wrong_tokens,
            "rollups_ok": rollups.ok, "settled_in_s": round(time.monotonic() - waited, 1)}


def fail_closed(s: Sample) -> bool:
    return s.tenant == "strict" and s.status == 503 and "cannot be checked" in (s.error or "")


def _ended(s: Sample) -> float:
    return s.sent_s + (s.e2e_s or 0.0)


def client_view(samples: list[Sample], hang_s: float,
                kill_window: tuple[float, float] | None = None) -> dict[str, Any]:
    """What the client saw. `kill_window`: from the engine's SIGKILL to when /readyz said it was back."""
    def label(s: Sample) -> str:
        if s.ok:
            return "200"
        if fail_closed(s):
            return "503 fail_closed"
        return "200 stream error" if s.status == 200 else "no answer" if s.status == 0 else str(s.status)

    answered = Counter(f"{s.tenant} {label(s)}" for s in samples)
    unexpected = [s for s in samples if s.status >= 500 and not fail_closed(s)]
    pools = Counter(f"{s.pool or '-'}" for s in samples if s.ok)
    micro_after = [s for s in samples if s.ok and s.pool == "micro" and s.sent_s > hang_s]
    # a stream cut off without an error event, or no HTTP answer at all: what no fault may cause
    cut_off = [s for s in samples if s.status == 0 or s.error == "stream ended without [DONE]"]
    kill: dict[str, Any] = {}
    if kill_window is not None:
        killed, back = kill_window
        kill = {"kill_window_s": [killed, back],
                "in_flight_at_kill": sum(s.sent_s <= killed <= _ended(s) for s in samples),
                "failed_over_after_kill": sum(s.ok and s.pool == "flagship" and killed <= s.sent_s <= back
                                              for s in samples),
                "micro_served_after_kill": sum(s.ok and s.pool == "micro" and s.sent_s > back for s in samples),
                "failed_at_kill": sum(not s.ok and not fail_closed(s) and s.sent_s <= killed <= _ended(s)
                                      for s in samples)}
    return {"sent": len(samples), "answered": dict(sorted(answered.items())), "pools": dict(pools),
            "unexpected_5xx": len(unexpected), "unexpected_examples": [s.error for s in unexpected[:3]],
            "other_failures": [f"{s.status} {s.error}" for s in samples
                               if not s.ok and not fail_closed(s) and s.status < 500][:5],
            "slowest_s": round(max((s.e2e_s or 0.0 for s in samples), default=0.0), 1),
            "slower_than_5s": sum((s.e2e_s or 0.0) > 5 for s in samples),
            "micro_served_after_hang": len(micro_after),
            "micro_back_at_s": round(min(s.sent_s for s in micro_after), 1) if micro_after else None,
            "cut_off": len(cut_off), "cut_off_examples": [f"{s.status} {s.error}" for s in cut_off[:3]], **kill}


def state(p: dict[str, Any]) -> str:
    """One /readyz answer in words: 200 (and the degraded pools), or 503 and why."""
    if p["status"] == 200:
        return "200" + (f" degraded {','.join(p['degraded'])}" if p["degraded"] else "")
    if p["status"] == 0:
        return "no answer"
    down = [n for n in p["required"] if not p["pools"].get(n, False)]
    why = (["redis down"] if p["redis"] is False else []) + [f"{n} down (required)" for n in down]
    return f"{p['status']} " + (", ".join(why) or "no reason (optional pools only)")


def readiness(ready: list[dict[str, Any]]) -> dict[str, Any]:
    """/readyz spans (state changes) and each 503's reason."""
    spans: list[list[Any]] = []
    for p in ready:
        s = state(p)
        if spans and spans[-1][2] == s:
            spans[-1][1] = p["t"]
        else:
            spans.append([p["t"], p["t"], s])
    unexplained = [p for p in ready if (p["status"] != 200 and "no reason" in state(p)) or p["status"] == 0]
    cloud_seen_down = any("cloud" in p.get("degraded", []) for p in ready)
    return {"samples": len(ready), "spans": spans, "unexplained_503": len(unexplained),
            "cloud_reported_degraded": cloud_seen_down}


def engine_restarts(url: str) -> dict[str, float]:
    _, body = http_get(url + "/metrics", timeout_s=10)
    return {lb.get("reason", "?"): v for name, lb, v in metric_samples(body.decode())
            if name == "cascade_engine_restarts_total" and lb.get("pool") == "micro"}


def micro_in_flight(url: str) -> float:
    """Requests the gateway has in flight on the micro pool's replicas (`cascade_replica_in_flight`)."""
    _, body = http_get(url + "/metrics", timeout_s=10)
    return sum(v for name, lb, v in metric_samples(body.decode())
               if name == "cascade_replica_in_flight" and lb.get("pool") == "micro")


def supervisor_lines(log: Path) -> list[str]:
    """What the supervisor said about the micro pool (starts, the hang, the restart and how long it took), and
    when the gateway's own probes and requests took its replica out of routing and back (`replica down`, with
    the reason, and `replica ready`), each with the log's time of day."""
    if not log.exists():
        return []
    lines = []
    for line in log.read_text(errors="replace").splitlines():
        with contextlib.suppress(orjson.JSONDecodeError, AttributeError):
            entry = orjson.loads(line) if line.startswith("{") else {"msg": line}
            message, at = entry.get("msg", ""), str(entry.get("ts", ""))[11:22]
            if "pool micro:" in message and "waiting for" not in message:
                lines.append(f"{at} {message[:200]}")
            elif message in ("replica down", "replica ready") and entry.get("pool") == "micro":
                lines.append(f"{at} gateway: {message} {entry.get('reason', '')}"[:200])
    return lines


def check_invariants(record: dict[str, Any]) -> list[Check]:
    client, ledger, ready = record["client"], record["ledger"], record["readyz"]
    hung = record["engine_pid"]["hung"]
    return [
        Check("no 5xx but the fail_closed 503s", client["unexpected_5xx"] == 0, str(client["unexpected_examples"])),
        Check("no lost cost record (every completed request recorded once, its tokens, rollups verified)",
              not ledger["lost"] and not ledger["twice"] and not ledger["wrong_tokens"] and ledger["rollups_ok"],
              f"{ledger['completed']} completed, {ledger['by_status']} records; lost {ledger['lost'][:3]}"),
        Check("the hung engine was restarted and counted", record["restarts"].get("hung", 0) >= 1
              and bool(hung) and record["engine_pid"]["after"] not in hung, f"restarts {record['restarts']}"),
        Check("the micro engine serves again after its restart", client["micro_served_after_hang"] > 0,
              f"first at {client['micro_back_at_s']} s"),
        Check("/readyz never failed because of the optional cloud pool", ready["unexplained_503"] == 0
              and ready["cloud_reported_degraded"], f"{len(ready['spans'])} spans"),
        Check("no answer cut off (every failure an HTTP error or an error event in the stream)",
              client.get("cut_off", 0) == 0, str(client.get("cut_off_examples", []))),
        *_kill_checks(record),
    ]


def _kill_checks(record: dict[str, Any]) -> list[Check]:
    """The SIGKILLed engine's invariants, where the run killed one."""
    killed, client = record["engine_pid"].get("killed", []), record["client"]
    if not killed:
        return []
    left = {pid: members for pid, members in record.get("killed_group_left", {}).items() if members}
    return [
        Check("the killed engine was restarted and counted, none of its group left",
              record["restarts"].get("exited", 0) >= 1 and record["engine_pid"]["after"] not in killed and not left,
              f"restarts {record['restarts']}; left {left}"),
        Check("the restarted engine core is placed beside its worker", record["placement"]["placed"],
              str(record["placement"])),
        Check("requests failed over to flagship while the killed engine restarted",
              client["failed_over_after_kill"] > 0, f"window {client['kill_window_s']}"),
        Check("the micro engine serves again after the kill", client["micro_served_after_kill"] > 0,
              f"window {client['kill_window_s']}"),
    ]


def format_record(record: dict[str, Any]) -> str:
    c, led, r = record["client"], record["ledger"], record["readyz"]
    lines = [f"load average at start {record['loadavg_at_start']}, at end {record['loadavg_at_end']}",
             "faults: " + "; ".join(f"{t:.1f} s {what}" for t, what in record["events"]),
             f"requests sent {c['sent']}; answered: " + ", ".join(f"{k} {v}" for k, v in c["answered"].items()),
             f"served by pool: {c['pools']}; micro again from {c['micro_back_at_s']} s "
             f"({c['micro_served_after_hang']} after the hang)",
             f"5xx other than fail_closed 503: {c['unexpected_5xx']} {c['unexpected_examples']}; slowest answer "
             f"{c['slowest_s']} s, {c['slower_than_5s']} slower than 5 s",
             f"other failures, e.g.: {c['other_failures']}",
             f"ledger: {led['records']} records {led['by_status']} vs {led['completed']} completed; lost "
             f"{len(led['lost'])}, recorded twice {len(led['twice'])}, ok but not completed "
             f"{len(led['ok_not_completed'])}, tokens differ {len(led['wrong_tokens'])}, rollups verified "
             f"{led['rollups_ok']} (settled {led['settled_in_s']} s after the load)",
             f"engine restarts (cascade_engine_restarts_total, pool micro): {record['restarts']}; engine pid "
             f"hung {record['engine_pid']['hung']}, killed {record['engine_pid'].get('killed', [])} -> "
             f"{record['engine_pid']['after']}",
             *([f"around the kill {c['kill_window_s']} s: {c['in_flight_at_kill']} in flight, "
                f"{c['failed_at_kill']} of them failed cleanly, {c['failed_over_after_kill']} failed over, "
                f"{c['micro_served_after_kill']} on micro after; placement {record['placement']}"]
               if "kill_window_s" in c else []),
             *(f"  supervisor: {line}" for line in record["supervisor"]),
             f"/readyz ({r['samples']} polls, 0.5 s apart):"]
    lines += [f"  {a:6.1f}-{b:6.1f} s  {s}" for a, b, s in r["spans"]]
    return "\n".join(lines)
