"""`cascade costs report`, `cascade costs batch` and `cascade costs verify`: finance reports (one batch's spend:
`gateway.costs.by_batch`) and reconciliation from the CLI.

`register(subparsers)` adds the `costs` command to the `cascade` parser; each leaf sets
`func(args) -> int` (the exit code). Exit codes: 0 fine, 1 `verify` found differences, 2 usage error or
Redis unreachable (one line on stderr, no traceback). A report with no record under its prefix is written as
such (its summary says what to check) and also said in one line on stderr; it exits 0.

The ledger prefix is `--prefix`, else $CASCADE_REDIS_PREFIX, else `cascade:` (the gateway's own default); the
report names the prefix it read.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.cli.output import write_output
from gateway.costs.formats import render_csv, render_json
from gateway.costs.html import render_html
from gateway.costs.prefixes import ledger_prefixes
from gateway.costs.report import (
    GROUPINGS,
    CostReport,
    Reconciliation,
    load_report,
    verify,
)
from gateway.costs.summary import empty_lines
from gateway.costs.view import render_text
from gateway.ledger.store import LedgerKeys
from gateway.redis_client import run_with_redis, safe_url

if TYPE_CHECKING:
    from gateway.costs.by_key import KeyRow

__all__ = ["DEFAULT_PREFIX", "print_report", "register", "render", "write_report"]

_MAX_DAYS = 3660
DEFAULT_PREFIX = "cascade:"
FORMATS = ("csv", "html", "json", "table")


def render(report: CostReport, by: str, fmt: str, wide: bool = False,
           key_rows: Sequence[KeyRow] | None = None) -> str:
    """`report` grouped by `by` in format `fmt` (table, csv, json or html); `wide`: every column (table, html);
    `key_rows` are the rows of `by="key"` (`gateway.costs.by_key`)."""
    if by == "key":
        from gateway.costs.by_key import render_keys

        if fmt in ("csv", "json"):
            return render_keys(key_rows or [], report, fmt)
    elif fmt == "csv":
        return render_csv(report, by)
    elif fmt == "json":
        return render_json(report, by)
    if fmt == "html":
        return render_html(report, by, wide, key_rows)
    return render_text(report, by, wide, key_rows)


def register(subparsers: Any) -> None:
    """Add `costs report` and `costs verify` to a `cascade` subparsers object."""
    costs = subparsers.add_parser("costs", help="cost reports and ledger reconciliation")
    leaves = costs.add_subparsers(dest="costs_command", required=True)
    report = leaves.add_parser("report", help="tokens, cost and savings for a UTC date range")
    _common(report)
    report.add_argument("--by", choices=(*GROUPINGS, "key"), default="tenant",
                        help="the rows: per tenant, pool, model, UTC day, endpoint or API key (default: tenant)")
    report.add_argument("--format", choices=FORMATS, default="table")
    report.add_argument("--wide", action="store_true", help="every column (tokens, cache, checks, each pool's "
                        "share) and exact micro-USD amounts; the default view fits 100 columns")
    report.add_argument("--out", type=Path, help="write here instead of stdout")
    report.add_argument("--policy", type=Path, help="policy naming the micro and flagship pools, for the quality "
                        "kept, and the prices stated under the table (default: the demo policy)")
    report.add_argument("--artifact", type=Path, help="router artifact .json whose evaluation curve estimates the "
                        "quality kept (default: the shipped one)")
    report.set_defaults(func=_run_report)
    batch = leaves.add_parser("batch", help="one batch's spend: its lines' records by pool")
    batch.add_argument("batch_id")
    batch.add_argument("--format", choices=("table", "json"), default="table")
    _redis_options(batch)
    batch.set_defaults(func=_run_batch)
    check = leaves.add_parser("verify", help="recompute rollups from the per-request records and compare")
    _common(check)
    check.set_defaults(func=_run_verify)


def _common(parser: argparse.ArgumentParser) -> None:
    today = datetime.now(UTC).date()
    parser.add_argument(
        "--from",
        dest="start",
        type=_day,
        default=today - timedelta(days=6),
        help="first UTC day, YYYY-MM-DD (default: 6 days ago)",
    )
    parser.add_argument("--to", dest="end", type=_day, default=today, help="last UTC day (default: today)")
    _redis_options(parser)


def _redis_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--redis-url",
        default=os.environ.get("CASCADE_REDIS_URL", "redis://127.0.0.1:6379/0"),
        help="default: $CASCADE_REDIS_URL or redis://127.0.0.1:6379/0",
    )
    parser.add_argument("--prefix", default=os.environ.get("CASCADE_REDIS_PREFIX") or DEFAULT_PREFIX,
                        help="the gateway's ledger key prefix (default: $CASCADE_REDIS_PREFIX or cascade:; the "
                        "quick start writes under cascade-demo:)")


def _day(text: str) -> date:
    try:
        return datetime.strptime(text, "%Y-%m-%d").replace(tzinfo=UTC).date()
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a date (YYYY-MM-DD): {text!r}") from exc


def _run_report(args: argparse.Namespace) -> int:
    return write_report(args.redis_url, args.prefix, args.start, args.end, by=args.by, fmt=args.format,
                        out=args.out, policy=args.policy, artifact=args.artifact, wide=args.wide)


def write_report(redis_url: str, prefix: str, start: date, end: date, *, by: str = "tenant", fmt: str = "table",
                 out: Path | None = None, policy: Path | None = None, artifact: Path | None = None,
                 wide: bool = False) -> int:
    """`cascade costs report`: the ledger under `prefix` from UTC day `start` to `end` (both included), grouped
    by `by` in format `fmt`, with the quality kept estimated from `policy` (default: the demo policy) and
    `artifact` (default: the shipped router's), written to `out` or stdout. Returns the exit code: 0, or 2
    after one line on stderr (a bad range, Redis unreachable)."""
    if (code := _check_range(start, end)) is not None:
        return code
    loaded = run_with_redis(redis_url, "cascade costs", lambda client: _load(client, prefix, start, end, by))
    if loaded is None:
        return 2
    report, key_rows = loaded
    report = replace(report, source=safe_url(redis_url))
    if not report.cells:
        print("cascade costs: " + " ".join(empty_lines(report)), file=sys.stderr)
    text = render(_with_policy_figures(report, redis_url, prefix, policy, artifact), by, fmt, wide, key_rows)
    write_output(text, out)
    return 0


async def _load(client: Any, prefix: str, start: date, end: date, by: str) -> tuple[CostReport, list[KeyRow]]:
    """The report's rollups and, for `by="key"`, the per-key counters; with no rollup, the prefixes that have
    some on this Redis (`gateway.costs.prefixes`)."""
    from gateway.costs.by_key import load_key_rows

    keys = LedgerKeys(prefix)
    report = await load_report(client, keys, start, end)
    if not report.cells:  # say where the records are, not only that there are none here
        return replace(report, elsewhere=await ledger_prefixes(client)), []
    return report, (await load_key_rows(client, keys, start, end) if by == "key" else [])


def print_report(redis_url: str, by: str = "tenant", days: int = 7, prefix: str = DEFAULT_PREFIX) -> int:
    """Print the table report of the last `days` UTC days (today included), as `cascade costs report` does."""
    end = datetime.now(UTC).date()
    return write_report(redis_url, prefix, end - timedelta(days=days - 1), end, by=by)


def _with_policy_figures(report: CostReport, redis_url: str, prefix: str, policy_path: Path | None,
                         artifact: Path | None) -> CostReport:
    """`report` with the quality routing kept (`gateway.costs.quality`) and the rates of its pools
    (`gateway.costs.prices`), both read from the policy; never fails the report."""
    from gateway.costs.prices import PriceBasis
    from gateway.costs.quality import read_label_estimate, with_quality
    from policies.loader import PolicyError, default_policy_path, load_policy

    path = policy_path or default_policy_path()
    try:
        loaded = load_policy(path)
    except PolicyError as exc:
        problem = str(exc).splitlines()[-1].strip()
        report = replace(report, prices=PriceBasis(str(path), unavailable=f"policy refused: {problem}"))
        return with_quality(report, None, policy_problem=problem)
    labels = read_label_estimate(redis_url, prefix, loaded.policy.routing.micro_pool)
    return with_quality(report.with_prices(loaded.policy, loaded.source), loaded.policy, artifact, labels)


def _run_batch(args: argparse.Namespace) -> int:
    """`cascade costs batch`: 0 and the table, or 2 after one line on stderr (no such batch, Redis unreachable)."""
    from gateway.costs.by_batch import BatchSpend, load_batch_spend, render_batch_spend

    async def load(client: Any) -> tuple[BatchSpend | None]:  # a tuple: "no such batch" is not "Redis failed"
        return (await load_batch_spend(client, args.prefix, args.batch_id),)

    loaded = run_with_redis(args.redis_url, "cascade costs", load)
    if loaded is None:
        return 2
    spend = loaded[0]
    if spend is None:
        print(f"cascade costs: no batch {args.batch_id} under the prefix {args.prefix!r}", file=sys.stderr)
        return 2
    sys.stdout.write(render_batch_spend(spend, args.format))
    return 0


def _run_verify(args: argparse.Namespace) -> int:
    if (code := _check_range(args.start, args.end)) is not None:
        return code
    keys = LedgerKeys(args.prefix)
    result = run_with_redis(args.redis_url, "cascade costs", lambda client: verify(client, keys, args.start, args.end))
    if result is None:
        return 2
    sys.stdout.write(_verify_text(result, args.start, args.end))
    return 0 if result.ok else 1


def _verify_text(result: Reconciliation, start: date, end: date) -> str:
    lines = [
        f"verify {start.isoformat()} .. {end.isoformat()}: {result.records} records, "
        f"{result.rollups_checked} rollups, {len(result.differences)} differences"
    ]
    if result.trimmed_through is not None:
        lines.append(
            f"warning: stream trimmed by retention, the oldest record kept is id {result.trimmed_through}; "
            "rollups of earlier records cannot be recomputed"
        )
    lines += [
        f"DIFF {d.key} {d.field}: rollup={d.rollup} records={d.recomputed} ({d.rollup - d.recomputed:+d})"
        for d in result.differences
    ]
    lines += [f"DUPLICATE request id in stream: {rid}" for rid in result.duplicate_request_ids]
    lines += [f"MALFORMED stream entry: {eid}" for eid in result.malformed_entries]
    lines.append("OK" if result.ok else "MISMATCH")
    return "\n".join(lines) + "\n"


def _check_range(start: date, end: date) -> int | None:
    """None for a range the commands take; else exit code 2 after one line on stderr."""
    if start > end:
        print("cascade costs: --from is after --to", file=sys.stderr)
        return 2
    if (end - start).days >= _MAX_DAYS:
        print(f"cascade costs: range longer than {_MAX_DAYS} days", file=sys.stderr)
        return 2
    return None


