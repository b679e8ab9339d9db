"""Spend per API key (`cascade costs report --by key`), from the ledger's per-key counters.

The record script adds each record that carries a key id to `LedgerKeys.key_spend(tenant, day)` (requests,
prompt and completion tokens, cost), in the same atomic step as the rollups, so these figures are exact like
them; records without a key id (before keys were recorded, or shadow calls) are in no key's row. Two pipelined
round trips per report.
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any

import orjson

from gateway.costs.report import CostReport, usd
from gateway.costs.summary import summary_lines
from gateway.ledger.keys import LedgerKeys

__all__ = ["NO_KEY", "KeyRow", "key_notes", "load_key_rows", "render_keys"]

NO_KEY = "(no key id)"

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


def render_keys(rows: Sequence[KeyRow], report: CostReport, fmt: str) -> str:
    """`rows` as CSV or JSON (`fmt`), with a "(no key id)" row for the records without a key and the TOTAL of
    `report` (the same rows as the table, `gateway.costs.view`); money as micro-USD and USD strings. The TOTAL also
    carries the flagship counterfactual and the saving, as the table's does (no key row can: blank in CSV); JSON
    also the summary's sentences, the quality and the prices, as every other grouping's."""
    data = [row.fields() for row in rows]
    total = report.total().counters
    rest = KeyRow("-", NO_KEY, *(getattr(total, name) - sum(getattr(r, name) for r in rows) for name in _FIELDS))
    if rest.requests > 0:
        data.append(rest.fields())
    whole = {**KeyRow("", "TOTAL", *(getattr(total, name) for name in _FIELDS)).fields(),
             "flagship_cost_micro_usd": total.flagship_cost_micro_usd, "flagship_cost_usd": usd(
                 total.flagship_cost_micro_usd), "savings_micro_usd": total.savings_micro_usd,
             "savings_usd": usd(total.savings_micro_usd)}
    if fmt == "json":
        return orjson.dumps({"from": str(report.start), "to": str(report.end), "by": "key", "prefix": report.prefix,
                             "rows": data, "total": whole, "notes": key_notes(rows), "summary": summary_lines(report),
                             "quality": None if report.quality is None else report.quality.fields(),
                             "prices": None if report.prices is None else report.prices.fields()},
                            option=orjson.OPT_INDENT_2).decode() + "\n"
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(whole), lineterminator="\n")
    writer.writeheader()
    writer.writerows([*data, whole])
    return buf.getvalue()


def key_notes(keys: Sequence[KeyRow]) -> list[str]:
    """Per key: why it is under two tenants, when it is; and what the "-" cells mean."""
    tenants: dict[str, dict[str, int]] = defaultdict(dict)
    for row in keys:
        tenants[row.key_id][row.tenant] = row.requests
    notes = ["Per key the ledger keeps requests, tokens and cost; the flagship counterfactual is kept per tenant, "
             f"pool, model and day (TOTAL); {NO_KEY}: requests without an API key (open access, shadow calls)."]
    for key_id, seen in sorted(tenants.items()):
        if len(seen) > 1:
            each = ", ".join(f"{t} ({n:,} requests)" for t, n in sorted(seen.items()))
            notes.append(f"Key {key_id} appears under {len(seen)} tenants, {each}: a request is recorded under the "
                         "tenant it was served as, so the key was re-issued for another tenant, or was served as "
                         "`default` while the policy did not name its tenant.")
    return notes
