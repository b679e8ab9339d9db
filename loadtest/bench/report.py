"""Results of the overhead benchmark: summaries over rounds, PASS/FAIL verdicts against the overhead targets,
the py-spy profile digest, and the printed tables."""

from __future__ import annotations

import argparse
import re
import statistics
from collections.abc import Sequence
from typing import Any

__all__ = [
    "LITELLM_RPS",
    "TARGET_ADDED_P50_MS",
    "TARGET_RPS",
    "TARGET_STREAM_RATIO",
    "print_nonstream",
    "print_report",
    "print_stream",
    "summarise_nonstream",
    "summarise_stream",
    "top_frames",
    "verdicts",
]

LITELLM_RPS = 85.0
TARGET_RPS = 10 * LITELLM_RPS
TARGET_ADDED_P50_MS = 1.5
TARGET_STREAM_RATIO = 0.95


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _gateway_row(cells: list[dict[str, Any]], gw: str, conc: int) -> dict[str, Any]:
    direct = {c["round"]: c for c in cells if c["target"] == "direct" and c["concurrency"] == conc}
    mine = [c for c in cells if c["target"] == gw and c["concurrency"] == conc]
    paired = [(c, direct[c["round"]]) for c in mine if c["round"] in direct]
    return {
        "target": gw, "concurrency": conc, "rounds": len(mine),
        "rps": _median([c["rps"] for c in mine]), "rps_all": [c["rps"] for c in mine],
        "p50_ms": _median([c["p50_ms"] for c in mine]), "p99_ms": _median([c["p99_ms"] for c in mine]),
        "added_p50_ms": _median([c["p50_ms"] - d["p50_ms"] for c, d in paired]),
        "added_p99_ms": _median([c["p99_ms"] - d["p99_ms"] for c, d in paired]),
        "cpu_ms_per_req": _median([c["server_cpu_ms_per_req"] for c in mine]),
        "errors": sum(c["non2xx"] + c["socket_errors"] for c in mine),
        "timeouts": sum(c.get("timeouts", 0) for c in mine),
    }


def summarise_nonstream(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (target, concurrency): medians over rounds; added latency = median of paired differences."""
    rows = []
    names = list(dict.fromkeys(c["target"] for c in cells))
    for conc in sorted({c["concurrency"] for c in cells}):
        for name in names:
            row = _gateway_row(cells, name, conc)
            if name != "direct":
                row["x_litellm"] = row["rps"] / LITELLM_RPS if row["rps"] is not None else None
            else:
                row["added_p50_ms"] = row["added_p99_ms"] = None
            rows.append(row)
    return rows


def summarise_stream(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over rounds per target. `ratio` = median of per-round gateway/direct tokens/s; `pooled_ratio` =
    sums; `ratios_to_direct` gives the same median for every other target (another transport, the bare relay)."""
    names = list(dict.fromkeys(c["target"] for c in cells))
    by = {name: {c["round"]: c for c in cells if c["target"] == name} for name in names}
    direct = by.get("direct", {})

    def per_round(name: str) -> list[float]:
        rounds = sorted(set(direct) & set(by[name]))
        return [by[name][r]["tokens_per_s"] / direct[r]["tokens_per_s"] for r in rounds
                if direct[r]["tokens_per_s"] > 0]

    def pooled(name: str) -> float:
        wall = sum(c["wall_s"] for c in by[name].values())
        return sum(c["tokens"] for c in by[name].values()) / wall if wall else 0.0

    ratios = per_round("gateway") if "gateway" in by else []
    out: dict[str, Any] = {"rounds": len(ratios), "ratio": _median(ratios), "ratios": ratios, "targets": names}
    out["pooled_ratio"] = pooled("gateway") / pooled("direct") if "gateway" in by and pooled("direct") else None
    out["ratios_to_direct"] = {n: _median(per_round(n)) for n in names if n != "direct" and direct}
    for name, cs in by.items():
        vals = list(cs.values())
        out[name] = {"tokens_per_s": _median([c["tokens_per_s"] for c in vals]),
                     "tokens_per_s_all": [c["tokens_per_s"] for c in vals],
                     "ttft_p50_ms": _median([c["ttft_p50_ms"] for c in vals]),
                     "ttft_p99_ms": _median([c["ttft_p99_ms"] for c in vals]),
                     "errors": sum(c["errors"] for c in vals)}
    return out


# ---------------------------------------------------------------------------------------- profiling

def _frame_key(frame: str) -> str:
    """'handle (gateway/serving/service.py:93)' -> 'handle (gateway/serving/service.py)': aggregate over lines."""
    return re.sub(r":\d+\)$", ")", frame.strip())


def top_frames(collapsed: str, n: int = 15) -> dict[str, list[tuple[str, float]]]:
    """From py-spy's raw (collapsed-stack) output: the top `n` functions by self and by inclusive share (%)."""
    own: dict[str, int] = {}
    incl: dict[str, int] = {}
    total = 0
    for line in collapsed.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_frame_key(f) for f in stack.split(";") if f]
        total += count
        if frames:
            own[frames[-1]] = own.get(frames[-1], 0) + count
        for frame in set(frames):
            incl[frame] = incl.get(frame, 0) + count

    def top(counts: dict[str, int]) -> list[tuple[str, float]]:
        ranked = sorted(counts.items(), key=lambda kv: kv[1], reverse=True)[:n]
        return [(name, 100.0 * c / total) for name, c in ranked]

    return {"self": top(own), "inclusive": top(incl), "samples": [("total", float(total))]}


# ------------------------------------------------------------------------------------------- report

def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def _verdict(name: str, value: float | None, op: str, limit: float, unit: str = "") -> dict[str, Any]:
    ok = value is not None and (value >= limit if op == ">=" else value < limit)
    return {"target": name, "value": value, "op": op, "limit": limit, "unit": unit, "pass": ok}


def verdicts(nonstream: dict[str, Any] | None, stream: dict[str, Any] | None, gateway: str) -> list[dict[str, Any]]:
    """PASS/FAIL per overhead target, for the gateway with the default transport (`gateway`)."""
    out = []
    if nonstream:
        rows = {(r["target"], r["concurrency"]): r for r in nonstream["summary"]}
        for conc in (16, 64):
            if (gateway, conc) in rows:
                out.append(_verdict(f"{gateway} req/s at c={conc} (10x LiteLLM)", rows[gateway, conc]["rps"],
                                    ">=", TARGET_RPS, "req/s"))
        if (gateway, 1) in rows:
            out.append(_verdict(f"{gateway} added p50 at c=1", rows[gateway, 1]["added_p50_ms"], "<",
                                TARGET_ADDED_P50_MS, "ms"))
        errors = sum(r["errors"] for r in nonstream["summary"] if r["target"] != "direct")
        out.append(_verdict("non-streaming errors through gateways", float(errors), "<", 0.5, "responses"))
    if stream:
        s = stream["summary"]
        out.append(_verdict("streaming tokens/s gateway/direct", s["ratio"], ">=", TARGET_STREAM_RATIO, "x"))
        errors = sum(s[name]["errors"] for name in s.get("targets", ("direct", "gateway")))
        out.append(_verdict("streaming errors", float(errors), "<", 0.5))
    return out


def print_nonstream(result: dict[str, Any], args: argparse.Namespace) -> None:
    print(f"\nNon-streaming, wrk -t{args.wrk_threads}, medians of {args.rounds} rounds x {args.duration:g} s; "
          "+p50/+p99 = gateway minus direct, paired per round; t/o = slower than --wrk-timeout")
    print(f"{'c':>3}  {'target':<11} {'req/s':>8} {'xLiteLLM':>8} {'p50 ms':>7} {'p99 ms':>7} {'+p50 ms':>8} "
          f"{'+p99 ms':>8} {'cpu ms/req':>10} {'errors':>6} {'t/o':>4}  req/s per round")
    for r in result["summary"]:
        per_round = " ".join(f"{v:.0f}" for v in r["rps_all"])
        print(f"{r['concurrency']:>3}  {r['target']:<11} {_fmt(r['rps'], '.0f'):>8} "
              f"{_fmt(r.get('x_litellm'), '.1f'):>8} {_fmt(r['p50_ms']):>7} {_fmt(r['p99_ms']):>7} "
              f"{_fmt(r['added_p50_ms']):>8} {_fmt(r['added_p99_ms']):>8} {_fmt(r['cpu_ms_per_req']):>10} "
              f"{r['errors']:>6} {r['timeouts']:>4}  {per_round}")


def print_stream(result: dict[str, Any], args: argparse.Namespace) -> None:
    layouts = result.get("by_engine_core") or {"pinned": result["summary"]}
    for layout, s in layouts.items():
        print(f"\nStreaming, c={args.stream_concurrency}, max_tokens={args.stream_max_tokens} (ignore_eos), "
              f"medians of {s['rounds']} rounds x {args.stream_duration:g} s, engine {result['engine_url']}, "
              f"engine core {layout}")
        _print_stream_table(s)


def _print_stream_table(s: dict[str, Any]) -> None:
    print(f"{'target':<16} {'tok/s':>8} {'/direct':>8} {'TTFT p50':>9} {'TTFT p99':>9} {'errors':>6}  tok/s per round")
    for name in s.get("targets", ("direct", "gateway")):
        row = s[name]
        per_round = " ".join(f"{v:.0f}" for v in row["tokens_per_s_all"])
        ratio = s.get("ratios_to_direct", {}).get(name)
        print(f"{name:<16} {_fmt(row['tokens_per_s'], '.1f'):>8} {_fmt(ratio, '.3f'):>8} "
              f"{_fmt(row['ttft_p50_ms'], '.1f'):>9} {_fmt(row['ttft_p99_ms'], '.1f'):>9} {row['errors']:>6}  "
              f"{per_round}")
    ratios = " ".join(f"{r:.3f}" for r in s["ratios"])
    print(f"gateway/direct: median {_fmt(s['ratio'], '.3f')}, pooled {_fmt(s['pooled_ratio'], '.3f')}; "
          f"per round {ratios}")


def print_report(results: dict[str, Any], args: argparse.Namespace) -> None:
    if results.get("nonstream"):
        print_nonstream(results["nonstream"], args)
        prof = results["nonstream"].get("profile")
        if prof:
            print(f"\nProfile of {prof['target']} at c=64 (py-spy, % of samples; stacks in {prof['collapsed_stacks']})")
            for kind in ("self", "inclusive"):
                print(f"  top by {kind}:")
                for frame, pct in prof[kind]:
                    print(f"    {pct:5.1f}%  {frame}")
    if results.get("stream"):
        print_stream(results["stream"], args)
    print("\nTargets (gateway overhead):")
    for v in results["verdicts"]:
        print(f"  {'PASS' if v['pass'] else 'FAIL'}  {v['target']}: {_fmt(v['value'])} {v['unit']} "
              f"(target {v['op']} {v['limit']:g})")
