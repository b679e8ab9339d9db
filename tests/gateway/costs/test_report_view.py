"""The report finance reads: a plain-language summary first, one table layout for every grouping that fits 100
columns (`--wide` for the rest), totals and thousands separators everywhere, the prefix it read named, a clear
word when a prefix has no records, and the HTML page saying the same as the text."""

from __future__ import annotations

import html
import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from gateway.api.app import create_app
from gateway.costs.by_key import NO_KEY, KeyRow
from gateway.costs.cli import render, write_report
from gateway.costs.layout import WIDTH
from gateway.costs.quality import with_quality
from gateway.costs.report import GROUPINGS, Cell, CostReport, Counters
from gateway.costs.view import render_text
from gateway.ledger.store import CostRecord
from gateway.settings import Settings
from tests.conftest import SHARED_URL, delete_prefix, policy_yaml
from tests.gateway.costs.test_costs_domain import _policy
from tests.gateway.costs.test_costs_domain import artifact as artifact
from tests.gateway.costs.test_costs_report import write_records
from tests.gateway.ledger.test_ledger import make_record
from tests.servers import serve

DAY = "2026-03-02"
START = END = date(2026, 3, 2)
TENANTS = ("globex-international-holdings-emea", "acme", "initech")


def big_report() -> CostReport:
    """Finance-sized figures: 1.9 M requests, thousands of dollars, a long tenant name."""
    cells = []
    for i, tenant in enumerate(TENANTS):
        for pool, model, n in (("micro", "qwen-7b", 900_000 // (i + 1)), ("flagship", "qwen-30b", 90_000)):
            cost = n * (1_400 if pool == "micro" else 23_000)
            cells.append(Cell(DAY, tenant, pool, model, Counters(n, 300 * n, 120 * n, cost, 23_000 * n,
                                                                 in_domain_scored=n, in_domain_t8=n)))
    return CostReport(START, END, tuple(cells), prefix="cascade:")


def key_rows() -> list[KeyRow]:
    return [KeyRow("acme", "7f3a9c21", 600_000, 180_000_000, 72_000_000, 900_000_000),
            KeyRow("globex-international-holdings-emea", "7f3a9c21", 1_000, 300_000, 120_000, 1_400_000),
            KeyRow("initech", "0b12", 100_000, 30_000_000, 12_000_000, 150_000_000)]


def table_of(text: str) -> list[str]:
    """The table's lines of a text report: from its titles to its TOTAL."""
    lines = text.splitlines()
    rule = next(i for i, line in enumerate(lines) if set(line) == {"-"})
    end = next(i for i, line in enumerate(lines) if line.startswith("TOTAL"))
    return lines[rule - 1:end + 1]


@pytest.mark.parametrize("by", [*GROUPINGS, "key"])
def test_the_default_view_fits_100_columns_in_one_layout_with_totals(by: str) -> None:
    report = big_report().with_prices(_policy(), "policy.yaml")
    text = render_text(report, by, key_rows=key_rows())
    assert max(len(line) for line in text.splitlines()) <= WIDTH, text
    table = table_of(text)
    titles = re.split(r"\s{2,}", table[0].strip())
    assert titles[-6:] == ["requests", "spend USD", "all on flagship USD", "saved USD", "saved", "on flagship"]
    total = table[-1]
    assert total.startswith("TOTAL") and "1,920,000" in total  # thousands separators, the same total in every view
    assert "8,520.00" in total and "44,160.00" in total and "35,640.00" in total and "80.7%" in total
    wide = render_text(report, by, wide=True, key_rows=key_rows())
    assert "prompt tok" in wide and "cache hits" in wide and "% micro" in wide and "8,520.000000" in wide


def test_the_summary_comes_first_in_plain_words_with_what_to_do_about_unlike_traffic(artifact: Path) -> None:
    cells = (Cell(DAY, "acme", "micro", "m", Counters(70, 700, 70, 700, 7_000, in_domain_scored=70,
                                                      in_domain_t8=70)),
             Cell(DAY, "newco", "micro", "m", Counters(70, 700, 70, 700, 7_000, in_domain_scored=70,
                                                       in_domain_t0=70)),
             Cell(DAY, "newco", "flagship", "f", Counters(60, 600, 60, 6_000, 6_000, in_domain_scored=60,
                                                          in_domain_t1=60)))
    report = with_quality(CostReport(START, END, cells, prefix="p:").with_prices(_policy(), "p.yaml"), _policy(),
                          artifact)
    text = render_text(report, "tenant")
    summary = " ".join(text[:text.index("tenant  ")].split())
    assert "Spend: $0.007400 for 200 requests (2,200 tokens)." in summary
    assert "Sending every request to the flagship pool (flagship) would have cost $0.020000." in summary
    assert "Routing saved $0.012600, 63.0% of that." in summary
    assert re.search(r"Quality kept: about \d+% of the way from the micro pool's answers to the flagship's "
                     r"\(likely \d+% to \d+%\), with 30.0% of requests on the flagship\.", summary)
    assert "65% of the scored requests (most of all tenant newco) are unlike the router's training data" in summary
    assert "label this traffic (client feedback, learning.shadow), then `cascade router train --from-ledger`" in summary
    assert "~0." not in summary and "drift_share" not in summary  # the figures' own notation stays in the details
    assert summary.index("Spend:") < summary.index("Sending") < summary.index("Routing") < summary.index("Quality")


def test_a_quality_kept_near_zero_says_what_it_means_and_what_to_do(artifact: Path) -> None:
    """Almost everything on the micro pool, all of it unlike the training data: the summary read "quality kept
    about 0% (likely 0% to 0%)" and "hence the range" for a range of one figure, and nothing a reader could act on."""
    cells = (Cell(DAY, "default", "micro", "m", Counters(755_000, 10**8, 10**7, 75_500_000, 3_020_000_000,
                                                         in_domain_scored=755_000, in_domain_t0=755_000)),
             Cell(DAY, "default", "flagship", "f", Counters(574, 57_400, 5_740, 2_296_000, 2_296_000,
                                                            in_domain_scored=574, in_domain_t0=574)))
    report = with_quality(CostReport(START, END, cells, prefix="p:").with_prices(_policy(), "p.yaml"), _policy(),
                          artifact)
    text = render_text(report, "tenant")
    summary = " ".join(text[:text.index("tenant  ")].split())
    assert "Quality kept: about 0% of the way from the micro pool's answers to the flagship's, with 0.1% of " \
        "requests on the flagship." in summary
    assert "0.1%" in table_of(text)[-1]  # the summary's share is the table's
    assert "likely 0% to 0%" not in summary and "hence the range" not in summary
    assert "the saving was bought with the flagship's quality" in summary
    assert "send more to the flagship (the policy's `routing.threshold`: a lower cut, or a higher `flagship_share`)" \
        in summary
    assert "100% of the scored requests (most of all tenant default) are unlike the router's training data" in summary


def test_the_summary_names_the_base_of_the_flagship_share_when_other_pools_answer(artifact: Path) -> None:
    cells = (Cell(DAY, "acme", "micro", "m", Counters(60, 600, 60, 600, 6_000)),
             Cell(DAY, "acme", "flagship", "f", Counters(20, 200, 20, 2_000, 2_000)),
             Cell(DAY, "acme", "fallback", "q", Counters(20, 200, 20, 1_000, 2_000)))
    report = with_quality(CostReport(START, END, cells, prefix="p:").with_prices(_policy(), "p.yaml"), _policy(),
                          artifact)
    summary = " ".join(render_text(report, "pool").split())
    assert "with 25.0% of the 80 requests on the micro and flagship pools on the flagship" in summary


def test_a_key_under_two_tenants_says_why_and_unkeyed_records_make_up_the_total() -> None:
    text = render_text(big_report(), "key", key_rows=key_rows())
    rows = table_of(text)
    assert rows[0].startswith("key ") and " tenant " in rows[0]
    assert any(line.startswith(NO_KEY) for line in rows)  # 1.9 M requests, 701,000 with a key
    flat = " ".join(text.split())
    assert ("Key 7f3a9c21 appears under 2 tenants, acme (600,000 requests), globex-international-holdings-emea "
            "(1,000 requests): a request is recorded under the tenant it was served as") in flat
    assert "Key 0b12 appears" not in flat
    doc = json.loads(render(big_report(), "key", "json", key_rows=key_rows()))
    assert any(note.startswith("Key 7f3a9c21 appears under 2 tenants") for note in doc["notes"])
    assert doc["total"]["requests"] == 1_920_000 and doc["rows"][-1]["key_id"] == NO_KEY
    csv_text = render(big_report(), "key", "csv", key_rows=key_rows())
    assert csv_text.splitlines()[-1].split(",")[:3] == ["", "TOTAL", "1920000"]


def test_csv_and_json_by_key_carry_the_totals_and_summary_of_every_other_grouping() -> None:
    by_pool = json.loads(render(big_report(), "pool", "json"))
    by_key = json.loads(render(big_report(), "key", "json", key_rows=key_rows()))
    assert by_key["summary"] == by_pool["summary"] and by_key["summary"][0].startswith("Spend: $")
    for field in ("cost_micro_usd", "flagship_cost_micro_usd", "savings_micro_usd", "savings_usd"):
        assert by_key["total"][field] == by_pool["total"][field], field
    assert by_pool["total"]["savings_micro_usd"] > 0  # the check cannot pass on zeros
    lines = render(big_report(), "key", "csv", key_rows=key_rows()).splitlines()
    header, first, last = (line.split(",") for line in (lines[0], lines[1], lines[-1]))
    flagship = header.index("flagship_cost_micro_usd")
    assert first[flagship] == "" and int(last[flagship]) == by_pool["total"]["flagship_cost_micro_usd"]


def test_the_report_names_its_prefix_and_an_empty_prefix_says_what_to_do(
        prefix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = f"{prefix}elsewhere:"
    # tomorrow (UTC), later than other tests' records, so it is among the first prefixes named (latest first)
    when = datetime.now(UTC) + timedelta(hours=23)
    day = when.date()
    write_records(other, tmp_path / "outbox", [make_record(i, started_at=when.timestamp()) for i in range(3)])
    out = tmp_path / "report.txt"
    try:
        assert write_report(SHARED_URL, prefix, START, END, out=out) == 0
        later = (day + timedelta(days=3), day + timedelta(days=4))
        assert write_report(SHARED_URL, other, *later, out=tmp_path / "later.txt") == 0
    finally:
        delete_prefix(other)
    text = out.read_text()
    assert f"Read from the ledger prefix {prefix!r} on redis://127.0.0.1:6379/0." in text
    flat = " ".join(text.split())
    assert f"No cost records under the prefix {prefix!r} from 2026-03-02 to 2026-03-02 (UTC)." in flat
    assert "Cost records on this Redis are under" in flat and f"{other!r} ({day})" in flat  # where they are
    assert "pass it with --prefix" in flat and "TOTAL" not in text
    assert f"{other!r} ({day}, outside the range read)" in " ".join((tmp_path / "later.txt").read_text().split())
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and "No cost records" in err and "--prefix" in err and repr(other) in err


# --- the served page against the text, on the shared Redis ------------------------------------------------------


@pytest.fixture
def recorded(prefix: str, tmp_path: Path) -> list[CostRecord]:
    recs = [make_record(i, started_at=1_772_409_600.0 + 600.0 * i, key_id=f"a{i % 2}") for i in range(40)]

    write_records(prefix, tmp_path / "outbox", recs)
    return recs


@pytest.fixture
def page_gateway(prefix: str, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml("http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1"))
    settings = Settings(policy_path=policy, scorer="none", start_engines=False, ledger="redis", redis_prefix=prefix,
                        redis_url=SHARED_URL, admin_key="k", home=tmp_path, policy_watch_interval_s=0)
    with serve(create_app(settings)) as url:
        yield url, policy
    delete_prefix(prefix)


def _page_text(page: str) -> tuple[list[str], list[list[str]]]:
    """The summary's sentences and the table's cells of the served page."""
    root = ET.fromstring(page.split("\n", 1)[1])
    ns = {"h": "http://www.w3.org/1999/xhtml"}
    summary = next(s for s in root.iter("{http://www.w3.org/1999/xhtml}section") if s.get("class") == "summary")
    sentences = ["".join(p.itertext()) for p in summary.findall("h:p", ns)]
    table = root.find(".//h:table", ns)
    assert table is not None
    cells = [["".join(c.itertext()) for c in tr] for tr in table.iter("{http://www.w3.org/1999/xhtml}tr")]
    return sentences, cells


def _cards(page: str) -> dict[str, str]:
    root = ET.fromstring(page.split("\n", 1)[1])
    divs = root.iter("{http://www.w3.org/1999/xhtml}div")
    return {name: value for name, value in (list(d.itertext()) for d in divs if d.get("class") == "card")}


@pytest.mark.parametrize("by", [*GROUPINGS, "key"])
def test_the_html_file_and_the_text_say_the_same_for_every_grouping(by: str, artifact: Path) -> None:
    """Amounts between $1 and $100 (4 decimals in the text): the page's cards showed them to the cent."""
    cells = tuple(Cell(DAY, tenant, pool, pool, Counters(n, 300 * n, 120 * n, n * cost, n * 1_700,
                                                         in_domain_scored=n, in_domain_t8=n))
                  for tenant, pool, n, cost in (("acme", "micro", 9_000, 123), ("acme", "flagship", 2_000, 1_700),
                                                ("initech", "micro", 4_321, 99)))
    report = with_quality(CostReport(START, END, cells, prefix="p:").with_prices(_policy(), "p.yaml"), _policy(),
                          artifact)
    rows = [KeyRow("acme", "k1", 11_000, 0, 0, 9_000 * 123 + 2_000 * 1_700)]
    text = render(report, by, "table", key_rows=rows)
    sentences, page_cells = _page_text(render(report, by, "html", key_rows=rows))
    assert " ".join(sentences) == " ".join(text[:text.index("\n" + table_of(text)[0])].split("\n", 2)[2].split())
    assert page_cells == [re.split(r"\s{2,}", line.strip()) for line in table_of(text) if set(line) != {"-"}]
    total = page_cells[-1]
    assert total[-5:-2] == ["4.9348", "26.0457", "21.1109"]  # the check cannot pass on a table to the cent
    cards = _cards(render(report, by, "html", key_rows=rows))
    assert (cards["Spend"], cards["All on flagship"]) == ("$4.9348", "$26.0457")
    assert cards["Savings"] == "$21.1109 (81.1%)" and "Routing saved $21.1109, 81.1% of that." in sentences


@pytest.mark.redis
@pytest.mark.parametrize("by", ["pool", "key"])
def test_the_admin_page_and_the_text_say_the_same(recorded: list[CostRecord], prefix: str, tmp_path: Path,
                                                  page_gateway: tuple[str, Path], by: str) -> None:
    url, policy = page_gateway
    page = httpx.get(f"{url}/admin/costs", params={"from": "2026-03-02", "to": "2026-03-02", "by": by},
                     headers={"authorization": "Bearer k"})
    assert page.status_code == 200, page.text
    out = tmp_path / "report.txt"
    assert write_report(SHARED_URL, prefix, START, END, by=by, policy=policy, out=out) == 0
    text = out.read_text()
    sentences, cells = _page_text(page.text)
    assert len(sentences) >= 4 and len(cells) >= 3  # the check cannot pass on an empty page
    assert " ".join(sentences) == " ".join(text[:text.index("\n" + table_of(text)[0])].split("\n", 2)[2].split())
    text_cells = [re.split(r"\s{2,}", line.strip()) for line in table_of(text) if set(line) != {"-"}]
    assert cells == text_cells
    assert f"{sum(r.cost_micro_usd for r in recorded) / 1e6:.6f}" in cells[-1]


@pytest.mark.redis
def test_the_served_page_says_what_to_change_in_its_own_address_not_in_the_commands_flags(
        recorded: list[CostRecord], page_gateway: tuple[str, Path]) -> None:
    url, _ = page_gateway

    def page(**params: str) -> str:
        answer = httpx.get(f"{url}/admin/costs", params=params, headers={"authorization": "Bearer k"})
        assert answer.status_code == 200, answer.text
        return " ".join(html.unescape(answer.text).split())

    full = page(**{"from": DAY, "to": DAY, "by": "pool"})
    assert "TOTAL" in full and "wide=1 in the page's address shows tokens, cache, checks and every pool." in full
    assert "--wide" not in full  # a flag its reader cannot pass
    empty = page(**{"from": "2026-01-01", "to": "2026-01-01"})
    assert "No cost records under the prefix" in empty and "from= / to= (YYYY-MM-DD) in the page's address" in empty
    assert "pass it with --prefix" not in empty and "--from" not in empty
    text = render_text(big_report(), "pool")
    assert "--wide shows tokens" in " ".join(text.split())  # the command keeps its flags


@pytest.mark.parametrize("doc", ["README.md", "docs/costs.md"])
def test_the_report_shown_in_the_docs_is_the_default_view(doc: str) -> None:
    """The quick start's report in the README (and costs.md) is what `render_text` lays out for its own figures: the
    same header lines, the same columns and widths, within 100 columns."""
    text = (Path(__file__).resolve().parents[3] / doc).read_text()
    shown = text[text.index("\nCosts "):].split("```")[0].strip("\n").splitlines()
    assert shown[0].endswith("(UTC) by pool") and "Read from the ledger prefix 'cascade-demo:'" in shown[1]
    assert max(map(len, shown)) <= WIDTH
    table = table_of("\n".join(shown))
    rows = [re.split(r"\s{2,}", line.strip()) for line in table[2:-2]]
    assert [row[0] for row in rows] == ["flagship", "micro"]  # the check cannot pass on an empty table
    cells = tuple(Cell(DAY, "demo", name, name, Counters(int(n), 0, 0, round(float(spend) * 1e6),
                                                         round(float(flagship) * 1e6)))
                  for name, n, spend, flagship, *_ in rows)
    report = CostReport(START, END, cells, prefix="cascade-demo:", flagship_pool="flagship")
    assert table_of(render_text(report, "pool")) == table
