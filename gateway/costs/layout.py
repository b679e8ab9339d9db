"""The report's table, one layout for every grouping: a list of `Column`s and `lay_out`, which the text report and
the HTML page both render, so they show the same cells.

The default view fits 100 columns: the group, requests, spend, what everything on the flagship would have cost, the
saving (USD and share) and the flagship's share of the requests, with amounts rounded to the decimals the report's
size needs (`money_decimals`). `--wide` adds every counter (tokens, cost per 1k tokens, cache, output checks, each
pool's share) with amounts to the micro-USD. Amounts are formatted from integer micro-USD; a column another view
adds (a per-pool quality, say) is one more `Column` in `columns`.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["WIDTH", "Column", "columns", "fit_width", "lay_out", "money", "money_decimals", "text_table", "wrap"]

WIDTH = 100  # the default view's width in characters
_KEY_MIN = 12  # the group column is cut (ending in "~") to fit WIDTH, never below this
_CODE = re.compile(r"`[^`]*`")
_KEEP = "\x00"


def money(micro: int | None, decimals: int) -> str:
    """Integer micro-USD as USD with thousands separators and `decimals` (2 to 6) decimals, rounded half away from
    zero: money(1_234_567_891, 2) == "1,234.57"; "-" for None."""
    if micro is None:
        return "-"
    unit = 10 ** (6 - decimals)
    rounded = (abs(micro) + unit // 2) // unit
    whole, frac = divmod(rounded, 10**decimals)
    sign = "-" if micro < 0 and rounded else ""
    return f"{sign}{whole:,}.{frac:0{decimals}d}" if decimals else f"{sign}{whole:,}"


def money_decimals(largest_micro: int) -> int:
    """Decimals for a table whose largest amount is `largest_micro`: cents from $100, 4 decimals from $1, else all
    6 (a demo's amounts are fractions of a cent)."""
    if abs(largest_micro) >= 100_000_000:
        return 2
    return 4 if abs(largest_micro) >= 1_000_000 else 6


def _count(name: str) -> Callable[[Mapping[str, Any], int], str]:
    def cell(row: Mapping[str, Any], _: int) -> str:
        value = row.get(name)
        return "-" if value is None else f"{value:,}"
    return cell


def _usd(name: str) -> Callable[[Mapping[str, Any], int], str]:
    return lambda row, decimals: money(row.get(name), decimals)


def _text(name: str) -> Callable[[Mapping[str, Any], int], str]:
    return lambda row, _: "-" if row.get(name) is None else str(row[name])


@dataclass(frozen=True, slots=True)
class Column:
    """One column: `name` is the row field it shows (`gateway.costs.report.row_fields`), `cell` formats it from a
    row and the report's money decimals."""

    name: str
    title: str
    cell: Callable[[Mapping[str, Any], int], str]
    left: bool = False


def columns(by: str, pools: Sequence[str], flagship: str | None, wide: bool) -> list[Column]:
    """The columns of a report grouped by `by`: the default view, or with `wide` every counter and pool share."""
    first = [Column("key", by, _text("key"), left=True)]
    if by == "key":
        first.append(Column("tenant", "tenant", _text("tenant"), left=True))
    money_cols = [Column("cost_micro_usd", "spend USD", _usd("cost_micro_usd")),
                  Column("flagship_cost_micro_usd", "all on flagship USD", _usd("flagship_cost_micro_usd")),
                  Column("savings_micro_usd", "saved USD", _usd("savings_micro_usd")),
                  Column("savings_pct", "saved", _text("savings_pct"))]
    if not wide:
        share = [] if flagship is None else [Column(f"share_{flagship}", "on flagship", _text(f"share_{flagship}"))]
        return [*first, Column("requests", "requests", _count("requests")), *money_cols, *share]
    return [
        *first, Column("requests", "requests", _count("requests")),
        Column("prompt_tokens", "prompt tok", _count("prompt_tokens")),
        Column("completion_tokens", "compl tok", _count("completion_tokens")),
        Column("total_tokens", "total tok", _count("total_tokens")), *money_cols,
        Column("cost_per_1k_tokens_micro_usd", "USD/1k tok", _usd("cost_per_1k_tokens_micro_usd")),
        Column("cache_hit_rate", "cache hits", _text("cache_hit_rate")),
        Column("cache_avoided_micro_usd", "cache saved USD", _usd("cache_avoided_micro_usd")),
        Column("output_check_failure_rate", "checks failed", _text("output_check_failure_rate")),
        *(Column(f"share_{p}", f"% {p}", _text(f"share_{p}")) for p in pools),
    ]


def lay_out(cols: Sequence[Column], rows: Sequence[Mapping[str, Any]], total: Mapping[str, Any],
            decimals: int) -> list[list[str]]:
    """The table as cells: the titles, one line per row, then the total's line."""
    return [[c.title for c in cols], *([c.cell(row, decimals) for c in cols] for row in [*rows, total])]


def fit_width(cols: Sequence[Column], cells: list[list[str]], width: int = WIDTH) -> list[list[str]]:
    """`cells` with the values of the text columns (the group, a key's tenant) cut, widest first and ending in "~",
    until the text table fits `width`; never below `_KEY_MIN` characters or the title, and numbers never."""
    widths = [max(len(line[i]) for line in cells) for i in range(len(cols))]
    over = sum(widths) + 2 * (len(widths) - 1) - width
    limits = list(widths)
    while over > 0:
        cuttable = [i for i, c in enumerate(cols) if c.left and limits[i] > max(_KEY_MIN, len(cells[0][i]))]
        if not cuttable:
            break
        widest = max(cuttable, key=lambda i: limits[i])
        limits[widest] -= 1
        over -= 1
    return [cells[0], *([v if len(v) <= n else v[: n - 1] + "~" for v, n in zip(line, limits, strict=True)]
                        for line in cells[1:])]


def text_table(cols: Sequence[Column], cells: list[list[str]]) -> list[str]:
    """Aligned lines: the titles, a rule, the rows, a rule, the total; text left, numbers right."""
    widths = [max(len(line[i]) for line in cells) for i in range(len(cols))]

    def line(values: list[str]) -> str:
        parts = [v.ljust(w) if c.left else v.rjust(w) for v, w, c in zip(values, widths, cols, strict=True)]
        return "  ".join(parts).rstrip()

    rule = "-" * (sum(widths) + 2 * (len(widths) - 1))
    return [line(cells[0]), rule, *(line(c) for c in cells[1:-1]), rule, line(cells[-1])]


def wrap(lines: Sequence[str], width: int | None) -> list[str]:
    """Prose lines wrapped at `width` (continuations indented by two spaces more, a `command` never split); None
    leaves them whole."""
    if width is None:
        return list(lines)
    out: list[str] = []
    for line in lines:
        indent = " " * (len(line) - len(line.lstrip()))
        whole = _CODE.sub(lambda m: m.group(0).replace(" ", _KEEP), line)  # a `command` stays on one line
        out += [part.replace(_KEEP, " ") for part in textwrap.wrap(
            whole, width, subsequent_indent=indent + "  ", break_on_hyphens=False, break_long_words=False) or [""]]
    return out
