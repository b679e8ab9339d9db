"""What the text report and the HTML page show, built once: the header, the summary (`gateway.costs.summary`), the
table's cells for any grouping (`gateway.costs.layout`), the notes under it and how the figures were estimated.

`--by key` is laid out like every other grouping: its rows come from the ledger's per-key counters
(`gateway.costs.by_key`), which keep requests, tokens and cost but no flagship counterfactual (those cells read
"-"); a "(no key id)" row holds the records without a key, so the rows add up to the same TOTAL as every view.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.costs.by_key import NO_KEY, KeyRow, key_notes
from gateway.costs.layout import WIDTH, Column, columns, fit_width, lay_out, money_decimals, text_table, wrap
from gateway.costs.report import CostReport, row_fields
from gateway.costs.summary import COMMAND, Controls, summary_lines

__all__ = ["ReportView", "render_text", "report_view"]


@dataclass(frozen=True, slots=True)
class ReportView:
    """One report as people read it: `cells` are the table's titles, rows and TOTAL (`layout.lay_out`)."""

    report: CostReport
    by: str
    wide: bool
    header: list[str]
    summary: list[str]
    columns: list[Column]
    cells: list[list[str]]
    notes: list[str]
    details: list[str]
    decimals: int  # of every USD amount the view shows (the table's, the summary's, the page's cards)


def report_view(report: CostReport, by: str, wide: bool = False, key_rows: Sequence[KeyRow] | None = None,
                controls: Controls = COMMAND) -> ReportView:
    """The view of `report` grouped by `by` (`key`: laid out from `key_rows`); what it tells the reader to change is
    said with `controls` (the command's flags, or the served page's query)."""
    pools, total = report.pools, report.total()
    rows = _key_rows(report, key_rows or []) if by == "key" else [row_fields(r, pools) for r in report.rows(by)]
    totals = row_fields(total, pools)
    cols = columns(by, pools, report.flagship_pool, wide, tiers=total.counters.top_quality_milli > 0)
    decimals = 6 if wide else money_decimals(max(total.counters.cost_micro_usd,
                                                  total.counters.flagship_cost_micro_usd))
    cells = lay_out(cols, rows, totals, decimals)
    notes = [f"Amounts in USD{'' if decimals == 6 else f', rounded to {decimals} decimals'}; csv and json carry "
             f"exact micro-USD.{'' if wide else f' {controls.wide} shows tokens, cache, checks and every pool.'}"]
    if by == "key":
        notes += key_notes(key_rows or [])
    details = [*([] if report.prices is None else report.prices.lines()),
               *([] if report.quality is None else report.quality.lines())]
    return ReportView(report, by, wide, _header(report, by), summary_lines(report, controls), cols,
                      cells if wide else fit_width(cols, cells), notes, details, decimals)


def _header(report: CostReport, by: str) -> list[str]:
    where = "" if report.prefix is None else f"ledger prefix {report.prefix!r}"
    if report.source:
        where += f" on {report.source}"
    return [f"Costs {report.start.isoformat()} .. {report.end.isoformat()} (UTC) by {by}",
            *([f"Read from the {where.strip()}."] if where else [])]


def _key_rows(report: CostReport, keys: Sequence[KeyRow]) -> list[dict[str, Any]]:
    """Rows of `row_fields`' shape from the per-key counters, and the records without a key id."""
    rows: list[dict[str, Any]] = [
        {"key": k.key_id, "tenant": k.tenant, "requests": k.requests, "prompt_tokens": k.prompt_tokens,
         "completion_tokens": k.completion_tokens, "total_tokens": k.prompt_tokens + k.completion_tokens,
         "cost_micro_usd": k.cost_micro_usd} for k in keys]
    total = report.total().counters
    rest = {name: getattr(total, name) - sum(r[name] for r in rows)
            for name in ("requests", "prompt_tokens", "completion_tokens", "cost_micro_usd")}
    if rest["requests"] > 0:
        rest["total_tokens"] = rest["prompt_tokens"] + rest["completion_tokens"]
        rows.append({"key": NO_KEY, "tenant": "-", **rest})
    return rows


def render_text(report: CostReport, by: str, wide: bool = False, key_rows: Sequence[KeyRow] | None = None) -> str:
    """The text report: header, summary, the table, notes, then how the figures were estimated. The default view
    fits `layout.WIDTH` columns; `wide` leaves prose lines whole and shows every column."""
    view = report_view(report, by, wide, key_rows)
    width = None if wide else WIDTH
    if not report.cells:
        return "\n".join([*view.header, "", *wrap(view.summary, width)]) + "\n"
    parts = [*view.header, "", *wrap(view.summary, width), "", *text_table(view.columns, view.cells), "",
             *wrap(view.notes, width)]
    if view.details:
        parts += ["", "How the figures were estimated:", *wrap(view.details, width)]
    return "\n".join(parts) + "\n"
