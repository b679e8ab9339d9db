"""Spend per API key (`cascade costs report --by key`), from the ledger's per-key counters.

The record script adds each record that carries a key id to `LedgerKeys.key_spend(tenant, day)` (requests,
prompt and completion tokens, cost), in the same atomic step as the rollups, so these figures are exact like
them; records without a key id (before keys were recorded, or shadow calls) are in no key's row. Two pipelined
round trips per report.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any

import orjson

from gateway.costs.report import usd
from gateway.ledger.keys import LedgerKeys

__all__ = ["KeyRow", "load_key_rows", "render_keys"]

_FIELDS = ("requests", "prompt_tokens", "completion_tokens", "cost_micro_usd")


@dataclass(slots=True)
class KeyRow:
    """One API key's totals over the report's days; money in integer micro-USD."""

    tenant: str
    key_id: str
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_micro_usd: int = 0

    def fields(self) -> dict[str, Any]:
        return {"tenant": self.tenant, "key_id": self.key_id, "requests": self.requests,
                "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "cost_micro_usd": self.cost_micro_usd, "cost_usd": usd(self.cost_micro_usd)}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def load_key_rows(client: Any, keys: LedgerKeys, start: date, end: date) -> list[KeyRow]:
    """Every key's totals from UTC day `start` to `end` (both included), dearest first."""
    days = [str(start + timedelta(days=i)) for i in range((end - start).days + 1)]
    async with client.pipeline(transaction=False) as pipe:
        for day in days:
            pipe.smembers(keys.tenants_of_day(day))
        tenants = [(day, _text(t)) for day, found in zip(days, await pipe.execute(), strict=True) for t in found]
    async with client.pipeline(transaction=False) as pipe:
        for day, tenant in tenants:
            pipe.hgetall(keys.key_spend(tenant, day))
        spends = await pipe.execute() if tenants else []
    rows: dict[tuple[str, str], KeyRow] = {}
    for (_, tenant), spend in zip(tenants, spends, strict=True):
        for raw_field, value in spend.items():
            key_id, _, name = _text(raw_field).partition(":")
            if name in _FIELDS:
                row = rows.setdefault((tenant, key_id), KeyRow(tenant, key_id))
                setattr(row, name, getattr(row, name) + int(value))
    return sorted(rows.values(), key=lambda r: (-r.cost_micro_usd, r.tenant, r.key_id))


def render_keys(rows: Sequence[KeyRow], start: date, end: date, fmt: str) -> str:
    """`rows` as a table, CSV or JSON (`fmt`); html is not offered for keys."""
    data = [row.fields() for row in rows]
    if fmt == "json":
        return orjson.dumps({"from": str(start), "to": str(end), "by": "key", "rows": data},
                            option=orjson.OPT_INDENT_2).decode() + "\n"
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(KeyRow("", "").fields()), lineterminator="\n")
        writer.writeheader()
        writer.writerows(data)
        return buf.getvalue()
    columns = ["tenant", "key_id", "requests", "prompt_tokens", "completion_tokens", "cost_usd"]
    cells = [columns, *([str(row[c]) for c in columns] for row in data)]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    lines = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True)))
             for line in cells]
    title = f"spend per API key, {start} .. {end} (UTC)"
    return "\n".join([title, *lines, *([] if data else ["(no requests with a key id)"])]) + "\n"
