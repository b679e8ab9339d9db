"""The cost report as documents for programs: CSV (one row per group, then TOTAL) and JSON (rows, total, the
summary's sentences, quality and prices). The text and HTML views are `gateway.costs.view`."""

from __future__ import annotations

import csv
import io

import orjson

from gateway.costs.report import CostReport, row_fields
from gateway.costs.summary import summary_lines

__all__ = ["render_csv", "render_json"]


def render_json(report: CostReport, by: str) -> str:
    """JSON document: range, grouping, prefix, pools, rows and the total row (see `row_fields`), the summary's
    sentences (`gateway.costs.summary`), the quality and the prices."""
    pools = report.pools
    doc = {
        "from": report.start.isoformat(),
        "to": report.end.isoformat(),
        "by": by,
        "prefix": report.prefix,
        "currency": "USD",
        "pools": pools,
        "rows": [row_fields(r, pools) for r in report.rows(by)],
        "total": row_fields(report.total(), pools),
        "summary": summary_lines(report),
        "quality": None if report.quality is None else report.quality.fields(),
        "prices": None if report.prices is None else report.prices.fields(),
    }
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n"


def render_csv(report: CostReport, by: str) -> str:
    """CSV with a header row, one row per group and a final TOTAL row."""
    pools = report.pools
    rows = [row_fields(r, pools) for r in [*report.rows(by), report.total()]]
    rows[-1].update(report.quality.fields() if report.quality is not None else {})  # on the TOTAL row only
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[-1]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue().replace("key", by, 1)
