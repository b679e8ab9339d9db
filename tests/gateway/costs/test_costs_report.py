"""Report and reconciliation tests: formatting and rendering on in-memory reports, then loading,
`verify` and the CLI against the shared Redis (unique key prefix per test, cleaned up)."""

from __future__ import annotations

import argparse
import asyncio
import csv
import io
import json
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest
import redis

from gateway.costs.cli import print_report, register
from gateway.costs.formats import render_csv, render_json
from gateway.costs.html import render_html
from gateway.costs.report import GROUPINGS, Cell, CostReport, Counters, pct, usd
from gateway.costs.view import render_text
from gateway.ledger.store import CostRecord, LedgerKeys, RedisLedger
from tests.conftest import SHARED_URL
from tests.gateway.costs.test_soft_budget_and_cost_page_http import (
    FLAGSHIP_RGB,
    MICRO_RGB,
    pixels_of,
    render_in_chromium,
)
from tests.gateway.ledger.test_ledger import make_record, sums

DAY0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
START, END = date(2026, 1, 1), date(2026, 1, 4)


def sample_records() -> list[CostRecord]:
    """120 requests over 3 days (2026-01-01..03), 3 tenants, 2 pools (every 4th on the flagship)."""
    return [make_record(i, started_at=DAY0 + 1800.0 * i + 1.0) for i in range(120)]


def sample_report() -> CostReport:
    cells = []
    for i, day in enumerate(["2026-01-01", "2026-01-02", "2026-01-04"]):
        for j, (tenant, pool, model) in enumerate([("acme", "micro", "m7b"), ("beta<&>", "flagship", "moe")]):
            n = 10 * (i + 1) + j
            cells.append(Cell(day, tenant, pool, model, Counters(n, 100 * n, 20 * n, 1_234 * n, 5_000 * n)))
    return CostReport(START, END, tuple(cells))


def test_money_and_percent_formatting_is_exact() -> None:
    assert [usd(0), usd(1_234_567), usd(-5), usd(10**12)] == ["0.000000", "1.234567", "-0.000005", "1000000.000000"]
    assert [pct(1, 3), pct(2, 3), pct(-1, 3), pct(0, 0), pct(1, 2000)] == ["33.3%", "66.7%", "-33.3%", "-", "0.1%"]
    assert Counters(1, 2, 1, 1_000, 0).cost_per_1k_tokens_micro_usd == 333_333
    assert Counters(1, 1, 1, 1, 0).cost_per_1k_tokens_micro_usd == 500
    assert Counters().cost_per_1k_tokens_micro_usd is None


@pytest.mark.parametrize("by", GROUPINGS)
def test_rows_sum_to_total(by: str) -> None:
    report = sample_report()
    rows = report.rows(by)
    assert sum((r.counters for r in rows), Counters()) == report.total().counters
    assert all(sum(r.pool_requests.values()) == r.counters.requests for r in rows)


def test_table_csv_json_agree() -> None:
    report = sample_report()
    total = report.total().counters
    table = render_text(report, "tenant", wide=True).splitlines()
    first = table.index(next(line for line in table if line.startswith("tenant ")))
    body = table[first:table.index(next(line for line in table if line.startswith("TOTAL"))) + 1]
    assert len({len(line) for line in body}) == 1, "table columns are aligned"
    assert body[-1].startswith("TOTAL") and usd(total.cost_micro_usd) in body[-1]
    rows = list(csv.DictReader(io.StringIO(render_csv(report, "day"))))
    assert [r["day"] for r in rows] == ["2026-01-01", "2026-01-02", "2026-01-04", "TOTAL"]
    assert sum(int(r["cost_micro_usd"]) for r in rows[:-1]) == int(rows[-1]["cost_micro_usd"])
    doc = json.loads(render_json(report, "pool"))
    assert doc["total"]["cost_micro_usd"] == total.cost_micro_usd
    assert doc["total"]["savings_micro_usd"] == total.flagship_cost_micro_usd - total.cost_micro_usd
    assert {r["key"] for r in doc["rows"]} == {"micro", "flagship"}
    assert doc["rows"][0]["share_flagship"] in {"0.0%", "100.0%"}


def test_html_is_self_contained_well_formed_with_three_charts() -> None:
    page = render_html(sample_report(), "tenant")
    root = ET.fromstring(page.split("\n", 1)[1])  # XHTML syntax: any XML parser must accept it
    ns = {"h": "http://www.w3.org/1999/xhtml", "s": "http://www.w3.org/2000/svg"}
    assert len(root.findall(".//s:svg", ns)) == 3
    assert len(root.findall(".//s:rect", ns)) >= 6  # stacked bars and tenant bars
    assert root.findall(".//s:polyline", ns), "savings lines"
    assert "<script" not in page and "src=" not in page and "@import" not in page
    assert page.count("http") == page.count("http://www.w3.org/"), "no external resource"
    assert "beta&lt;&amp;&gt;" in page, "names are escaped"


def test_html_renders_an_empty_range() -> None:
    page = render_html(CostReport(START, START, ()), "day")
    ET.fromstring(page.split("\n", 1)[1])
    assert "No traffic" in page


# --- against the shared Redis ---------------------------------------------------------------------


async def record_all(prefix: str, outbox: Path, recs: Iterable[CostRecord]) -> None:
    """Write `recs` through a RedisLedger under `prefix` on the shared Redis."""
    led = RedisLedger(SHARED_URL, outbox, prefix)
    await led.start()
    await asyncio.gather(*(led.record(r) for r in recs))
    await led.aclose()


def write_records(prefix: str, outbox: Path, recs: Iterable[CostRecord]) -> None:
    """`record_all`, from a sync test (CLI tests run asyncio.run themselves)."""
    asyncio.run(record_all(prefix, outbox, recs))


@pytest.fixture
def recorded(prefix: str, tmp_path: Path) -> list[CostRecord]:
    """The sample records written through RedisLedger under `prefix`."""
    recs = sample_records()
    write_records(prefix, tmp_path / "outbox", recs)
    return recs


def run_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="cascade")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(argv))
    return int(args.func(args))


@pytest.mark.redis
def test_report_from_redis_matches_records(recorded: list[CostRecord], prefix: str) -> None:
    from gateway.costs.report import load_report

    async def load() -> CostReport:
        client = redis.asyncio.Redis.from_url(SHARED_URL)
        try:
            return await load_report(client, LedgerKeys(prefix), START, END)
        finally:
            await client.aclose()

    report = asyncio.run(load())
    assert report.total().counters == sums(recorded)
    by_day = {r.key: r.counters for r in report.rows("day")}
    assert by_day["2026-01-02"] == sums([r for r in recorded if DAY0 + 86_400 <= r.started_at < DAY0 + 172_800])
    by_pool = {r.key: r.counters.requests for r in report.rows("pool")}
    assert by_pool == {"flagship": 30, "micro": 90}


@pytest.mark.redis
@pytest.mark.parametrize("fmt", ["table", "csv", "json", "html"])
def test_cli_report_writes_each_format(recorded: list[CostRecord], prefix: str, tmp_path: Path, fmt: str) -> None:
    out = tmp_path / f"report.{fmt}"
    argv = ["costs", "report", "--from", "2026-01-01", "--to", "2026-01-04", "--by", "tenant"]
    assert run_cli(*argv, "--format", fmt, "--out", str(out), "--prefix", prefix) == 0
    text = out.read_text()
    assert usd(sums(recorded).cost_micro_usd) in text


@pytest.mark.redis
def test_verify_passes_then_detects_tampering(
    recorded: list[CostRecord], prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["costs", "verify", "--from", "2026-01-01", "--to", "2026-01-03", "--prefix", prefix]
    assert run_cli(*argv) == 0
    assert capsys.readouterr().out.strip().endswith("OK")
    keys = LedgerKeys(prefix)
    client = redis.Redis.from_url(SHARED_URL)
    try:
        client.hincrby(keys.day("2026-01-02", "tenant-1:micro:tiny-llama"), "cost_micro_usd", 7)
        client.delete(keys.hour("2026-01-03", "05:tenant-1:micro:tiny-llama"))
    finally:
        client.close()
    assert run_cli(*argv) == 1
    out = capsys.readouterr().out
    assert "rollup:day:2026-01-02:tenant-1:micro:tiny-llama cost_micro_usd" in out and "(+7)" in out
    assert "rollup:hour:2026-01-03T05:tenant-1:micro:tiny-llama requests: rollup=0 records=1" in out
    assert out.strip().endswith("MISMATCH")


@pytest.mark.redis
def test_demo_report_prints_what_the_cli_prints(
    prefix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`print_report` (the demo's cost totals) is `cascade costs report --format table` over the last `days`
    UTC days: the same bytes; a record from before those days is left out."""
    now = datetime.now(UTC)
    today = now.date()
    recent = [make_record(i, started_at=now.timestamp() - 3600.0 * i) for i in range(6)]  # today, maybe yesterday
    old = make_record(99, started_at=(now - timedelta(days=3)).timestamp())

    write_records(prefix, tmp_path / "outbox", [*recent, old])
    assert print_report(SHARED_URL, by="pool", days=3, prefix=prefix) == 0
    printed = capsys.readouterr().out
    since = (today - timedelta(days=2)).isoformat()
    argv = ["costs", "report", "--from", since, "--to", today.isoformat(), "--by", "pool", "--prefix", prefix]
    assert run_cli(*argv) == 0
    assert printed == capsys.readouterr().out
    total = [line for line in printed.splitlines() if line.startswith("TOTAL")]
    assert len(total) == 1 and usd(sums(recent).cost_micro_usd) in total[0]  # the older record left out


def test_cli_unreachable_redis_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli("costs", "report", "--redis-url", "redis://:secret@127.0.0.1:1/0") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unreachable" in err and "secret" not in err and "Traceback" not in err
    assert run_cli("costs", "verify", "--from", "2026-02-02", "--to", "2026-02-01") == 2


def test_cli_rejects_bad_dates() -> None:
    with pytest.raises(SystemExit) as exc:
        run_cli("costs", "report", "--from", "2026-13-01")
    assert exc.value.code == 2


def test_html_screenshot_with_chromium(tmp_path: Path) -> None:
    page = tmp_path / "costs.html"
    page.write_text(render_html(sample_report(), "tenant"))
    shot = tmp_path / "costs.png"
    dom = render_in_chromium(page, shot)
    assert dom.count("<svg") == 3 and "beta&lt;&amp;&gt;" in dom
    assert pixels_of(shot, MICRO_RGB) > 2_000 and pixels_of(shot, FLAGSHIP_RGB) > 2_000, "stacked bars drawn"
