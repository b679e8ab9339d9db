"""The finance report as one self-contained HTML page: inline CSS and inline SVG charts, no script, no
external resource (it can be mailed, archived, or served as is at GET /admin/costs).

Charts: spend per day stacked by pool, savings over time (flagship counterfactual vs. actual spend per
day), top tenants by spend. Amounts are computed from integer micro-USD; only pixel positions are floats.
The markup is well-formed XML (XHTML syntax) so it can be checked by any XML parser.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import TYPE_CHECKING

from gateway.costs.layout import money
from gateway.costs.report import CostReport, Counters, pct, usd
from gateway.costs.summary import COMMAND, Controls
from gateway.costs.view import ReportView, report_view

if TYPE_CHECKING:
    from gateway.costs.by_key import KeyRow

__all__ = ["render_html"]

_PALETTE = ("#4c78a8", "#f58518", "#54a24b", "#b279a2", "#e45756", "#72b7b2", "#eeca3b", "#9d755d")
_W, _H, _LEFT, _RIGHT, _TOP, _BOTTOM = 960, 300, 84, 16, 16, 44
_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1f2933;background:#f5f7fa;margin:0}
main{max-width:1040px;margin:0 auto;padding:24px}
h1{font-size:24px;margin:0 0 4px}h2{font-size:17px;margin:0 0 12px}
.sub{color:#52606d;margin:0 0 20px}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(150px,1fr));gap:12px;margin-bottom:20px}
.card{background:#fff;border-radius:8px;padding:12px 14px;box-shadow:0 1px 2px rgba(0,0,0,.08)}
.card b{display:block;font-size:20px}.card span{color:#52606d;font-size:12px;text-transform:uppercase}
section{background:#fff;border-radius:8px;padding:16px;margin-bottom:20px;box-shadow:0 1px 2px rgba(0,0,0,.08)}
svg{width:100%;height:auto}svg text{font-size:11px;fill:#52606d}
.legend{display:flex;gap:16px;flex-wrap:wrap;margin-top:6px;font-size:12px}
.legend i{display:inline-block;width:10px;height:10px;margin-right:5px;border-radius:2px}
table{border-collapse:collapse;width:100%;font-size:12px}
th,td{padding:5px 8px;border-bottom:1px solid #e4e7eb;text-align:right;white-space:nowrap}
th:first-child,td:first-child{text-align:left}th{background:#f0f4f8}
tr.total td{font-weight:600;border-top:2px solid #9aa5b1}
.scroll{overflow-x:auto}footer{color:#7b8794;font-size:12px}
"""


def render_html(report: CostReport, by: str, wide: bool = False, key_rows: Sequence[KeyRow] | None = None,
                controls: Controls = COMMAND) -> str:
    """The whole page for `report`, with the table grouped by `by`: the same summary, cells and notes as the text
    report (`gateway.costs.view`), then the charts. `controls`: `summary.PAGE` for the page a gateway serves."""
    view = report_view(report, by, wide, key_rows, controls)
    total = report.total().counters
    title = f"Cascade costs {report.start.isoformat()} to {report.end.isoformat()}"
    parts = [
        '<!DOCTYPE html>\n<html xmlns="http://www.w3.org/1999/xhtml" lang="en"><head><meta charset="utf-8" />',
        '<meta name="viewport" content="width=device-width, initial-scale=1" />',
        f"<title>{escape(title)}</title><style>{_CSS}</style></head><body><main>",
        f'<h1>Cascade costs</h1><p class="sub">{escape(" ".join(view.header[1:]))} '
        f"{escape(report.start.isoformat())} to {escape(report.end.isoformat())} (UTC days) · table grouped by "
        f"{escape(by)}</p>",
        _paragraphs("Summary", view.summary, "summary"),
        _section(f"By {by}", _table(view)),
        _cards(total, view.decimals),
        *([] if report.quality is None else [_quality(report.quality.lines())]),
        *([] if report.prices is None else [_prices(report.prices.lines())]),
        _section("Spend per day, stacked by pool", _spend_chart(report)),
        _section("Savings over time (flagship counterfactual vs. actual spend)", _savings_chart(report)),
        _section("Top tenants by spend", _tenants_chart(report)),
        "<footer>All amounts in USD, computed from integer micro-USD rollups. Savings = cost had every "
        "request run on the flagship pool at its prices, minus actual cost. % &lt;pool&gt; = share of the requests "
        "routed to that pool.</footer>",
        "</main></body></html>\n",
    ]
    return "\n".join(parts)


def _paragraphs(title: str, lines: list[str], css: str) -> str:
    items = "".join(f"<p>{escape(line)}</p>" for line in lines)
    return f'<section class="{css}"><h2>{escape(title)}</h2>{items}</section>'


def _quality(lines: list[str]) -> str:
    """The quality kept, right under the savings: a saving is never shown without its price in quality."""
    items = "".join(f"<p>{escape(line)}</p>" for line in lines)
    return f'<section class="quality"><h2>Quality kept by routing</h2>{items}</section>'


def _prices(lines: list[str]) -> str:
    """The rate each pool's cost was derived from (`gateway.costs.prices`)."""
    items = "".join(f"<p>{escape(line.strip())}</p>" for line in lines)
    return f'<section class="prices"><h2>Prices</h2>{items}</section>'


def _section(title: str, body: str) -> str:
    return f"<section><h2>{escape(title)}</h2>{body}</section>"


def _cards(total: Counters, decimals: int) -> str:
    """The TOTAL's figures as cards, USD amounts to the table's `decimals` (the page says what the text says)."""
    per_1k = total.cost_per_1k_tokens_micro_usd

    def usd_text(micro: int) -> str:
        return ("-" if micro < 0 else "") + "$" + money(abs(micro), decimals)

    cards = [
        ("Spend", usd_text(total.cost_micro_usd)),
        ("All on flagship", usd_text(total.flagship_cost_micro_usd)),
        (
            "Savings",
            f"{usd_text(total.savings_micro_usd)} ({pct(total.savings_micro_usd, total.flagship_cost_micro_usd)})",
        ),
        ("Requests", f"{total.requests:,}"),
        ("Tokens", f"{total.total_tokens:,}"),
        ("Cost / 1k tokens", "-" if per_1k is None else _money(per_1k)),
        ("Cache hits", f"{pct(total.cache_hits, total.cache_lookups)} of {total.cache_lookups:,} lookups"),
        ("Cache saved", usd_text(total.cache_avoided_micro_usd)),
    ]
    items = "".join(f'<div class="card"><span>{escape(k)}</span><b>{escape(v)}</b></div>' for k, v in cards)
    return f'<div class="cards">{items}</div>'


def _money(micro: int) -> str:
    """Short USD label for cards and axes: cents above one dollar, all 6 decimals below."""
    if micro == 0:
        return "$0"
    if abs(micro) >= 1_000_000:
        cents = (abs(micro) + 5_000) // 10_000
        return f"{'-' if micro < 0 else ''}${cents // 100:,}.{cents % 100:02d}"
    return f"${usd(micro)}"


def _nice_ceiling(value: int) -> int:
    """Smallest 1/2/5 x 10^k >= value (at least 1): the top of a y axis."""
    step = 1
    while True:
        for mult in (1, 2, 5):
            if step * mult >= value:
                return step * mult
        step *= 10


def _tick_labels(top: int) -> list[str]:
    """USD labels of the 6 y ticks from 0 to `top` micro-USD, all with the same number of decimals (2 to
    6): as few as every tick needs, so an axis reads $0.00, $0.20 ... $1.00, not $0, $0.200000 ... $1.00."""
    ticks = [top * i // 5 for i in range(6)]
    decimals = next(d for d in range(2, 7) if all(t % 10 ** (6 - d) == 0 for t in ticks))
    unit = 10 ** (6 - decimals)
    return [f"${t // 1_000_000:,}.{t % 1_000_000 // unit:0{decimals}d}" for t in ticks]


def _frame(top: int, days: list[str]) -> list[str]:
    """Y grid with 5 USD ticks up to `top` micro-USD, and day labels under the x axis."""
    plot_h, plot_w = _H - _TOP - _BOTTOM, _W - _LEFT - _RIGHT
    out = []
    for i, label in enumerate(_tick_labels(top)):
        y = _TOP + plot_h - plot_h * i / 5
        out.append(f'<line x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e4e7eb" />')
        out.append(f'<text x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{escape(label)}</text>')
    every = max(1, len(days) // 12)
    for i, day in enumerate(days):
        if i % every == 0:
            x = _LEFT + plot_w * (i + 0.5) / len(days)
            out.append(f'<text x="{x:.1f}" y="{_H - _BOTTOM + 16}" text-anchor="middle">{day[5:]}</text>')
    return out


def _svg(body: list[str], label: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_W} {_H}" role="img" '
        f'aria-label="{escape(label)}">{"".join(body)}</svg>'
    )


def _legend(items: list[tuple[str, str]]) -> str:
    spans = "".join(f'<span><i style="background:{c}"></i>{escape(name)}</span>' for name, c in items)
    return f'<div class="legend">{spans}</div>'


def _spend_chart(report: CostReport) -> str:
    data, pools, days = report.cost_by_day_and_pool(), report.pools, report.days
    colors = {p: _PALETTE[i % len(_PALETTE)] for i, p in enumerate(pools)}
    top = _nice_ceiling(max((sum(v.values()) for v in data.values()), default=0))
    plot_h, slot = _H - _TOP - _BOTTOM, (_W - _LEFT - _RIGHT) / len(days)
    body = _frame(top, days)
    for i, day in enumerate(days):
        base = 0
        for pool in pools:
            cost = data[day][pool]
            if cost <= 0:
                continue
            y0, y1 = (_TOP + plot_h - plot_h * v / top for v in (base, base + cost))
            tip = escape(f"{day} {pool}: ${usd(cost)}")
            body.append(
                f'<rect x="{_LEFT + slot * (i + 0.15):.1f}" y="{y1:.1f}" width="{slot * 0.7:.1f}" '
                f'height="{y0 - y1:.1f}" fill="{colors[pool]}"><title>{tip}</title></rect>'
            )
            base += cost
    return _svg(body, "spend per day stacked by pool") + _legend([(p, colors[p]) for p in pools])


def _savings_chart(report: CostReport) -> str:
    by_day = {row.key: row.counters for row in report.rows("day")}
    days = report.days
    series = [by_day.get(d, Counters()) for d in days]
    top = _nice_ceiling(max((c.flagship_cost_micro_usd for c in series), default=0))
    plot_h, slot = _H - _TOP - _BOTTOM, (_W - _LEFT - _RIGHT) / len(days)

    def points(values: list[int]) -> list[str]:
        return [f"{_LEFT + slot * (i + 0.5):.1f},{_TOP + plot_h - plot_h * v / top:.1f}" for i, v in enumerate(values)]

    flagship = points([c.flagship_cost_micro_usd for c in series])
    actual = points([c.cost_micro_usd for c in series])
    body = _frame(top, days)
    body.append(f'<polygon points="{" ".join(flagship + actual[::-1])}" fill="#54a24b" fill-opacity="0.22" />')
    body.append(
        f'<polyline points="{" ".join(flagship)}" fill="none" stroke="#e45756" stroke-width="2" '
        'stroke-dasharray="6 4" />'
    )
    body.append(f'<polyline points="{" ".join(actual)}" fill="none" stroke="#4c78a8" stroke-width="2" />')
    for i, c in enumerate(series):
        x, y = flagship[i].split(",")
        tip = escape(
            f"{days[i]}: saved ${usd(c.savings_micro_usd)} ({pct(c.savings_micro_usd, c.flagship_cost_micro_usd)})"
        )
        body.append(f'<circle cx="{x}" cy="{y}" r="3" fill="#e45756"><title>{tip}</title></circle>')
    legend = [("all on flagship", "#e45756"), ("actual spend", "#4c78a8"), ("savings", "#54a24b")]
    return _svg(body, "savings over time") + _legend(legend)


def _tenants_chart(report: CostReport, limit: int = 10) -> str:
    rows = report.rows("tenant")[:limit]
    if not rows:
        return "<p>No traffic in this range.</p>"
    top = max(1, *(max(r.counters.flagship_cost_micro_usd, r.counters.cost_micro_usd) for r in rows))
    bar_h, left, width = 26, 160, _W - 160 - 220
    body = []
    for i, row in enumerate(rows):
        c, y = row.counters, 8 + i * (bar_h + 8)
        full, used = width * c.flagship_cost_micro_usd / top, width * c.cost_micro_usd / top
        note = f"{_money(c.cost_micro_usd)} · saved {pct(c.savings_micro_usd, c.flagship_cost_micro_usd)}"
        body += [
            f'<text x="{left - 8}" y="{y + 17}" text-anchor="end">{escape(row.key)}</text>',
            f'<rect x="{left}" y="{y}" width="{full:.1f}" height="{bar_h}" fill="#e4e7eb" />',
            f'<rect x="{left}" y="{y}" width="{used:.1f}" height="{bar_h}" fill="#4c78a8"><title>'
            f"{escape(row.key + ': ' + note)}</title></rect>",
            f'<text x="{left + max(full, used) + 8:.1f}" y="{y + 17}">{escape(note)}</text>',
        ]
    height = 8 + len(rows) * (bar_h + 8)
    svg = (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_W} {height}" role="img" '
        f'aria-label="top tenants by spend">{"".join(body)}</svg>'
    )
    return svg + _legend([("actual spend", "#4c78a8"), ("cost if all on flagship", "#e4e7eb")])


def _table(view: ReportView) -> str:
    """The text report's table (`view.cells`: titles, rows, TOTAL) and its notes."""
    head = "".join(f"<th>{escape(title)}</th>" for title in view.cells[0])

    def tr(cells: list[str], css: str = "") -> str:
        tds = "".join(f"<td>{escape(cell)}</td>" for cell in cells)
        return f'<tr class="{css}">{tds}</tr>' if css else f"<tr>{tds}</tr>"

    body = "".join(tr(cells) for cells in view.cells[1:-1])
    notes = "".join(f'<p class="note">{escape(note)}</p>' for note in view.notes)
    return (f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}{tr(view.cells[-1], "total")}'
            f"</tbody></table></div>{notes}")
