"""One batch's spend (`cascade costs batch <batch id>`), from its lines' ledger records.

Every batch line's record carries its `batch_id` (`gateway.batches`); this reads the batch's tenant's record stream
from the batch's creation on (its lines cannot be recorded before) and sums the records of the batch, per pool: lines,
tokens, cost at the batch discount, the flagship counterfactual (discounted alike) and the saving. One XRANGE pass
over the tenant's records since then, 1,000 at a time. `cascade costs report --by endpoint` shows all batches' lines
together as its `batch` row.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.batches.store import BatchStore
from gateway.costs.counters import Counters, usd
from gateway.ledger.keys import LedgerKeys
from gateway.ledger.record import InvalidCostRecord, record_from_fields

__all__ = ["BatchSpend", "load_batch_spend", "render_batch_spend"]


@dataclass(slots=True)
class BatchSpend:
    """A batch's recorded lines by pool; money in integer micro-USD."""

    batch_id: str
    tenant: str
    status: str
    lines: int
    by_pool: dict[str, Counters] = field(default_factory=dict)

    @property
    def total(self) -> Counters:
        return sum(self.by_pool.values(), Counters())


async def load_batch_spend(client: Any, prefix: str, batch_id: str, chunk: int = 1000) -> BatchSpend | None:
    """The spend of `batch_id` under the ledger `prefix`; None when no such batch is known there."""
    batch = await BatchStore(client, prefix).batch(batch_id)
    if batch is None:
        return None
    stream, start = LedgerKeys(prefix).stream(batch.tenant), f"{batch.created_at * 1000}-0"
    by_pool: dict[str, Counters] = defaultdict(Counters)
    while True:
        entries = await client.xrange(stream, min=start, max="+", count=chunk)
        for _, raw in entries:
            fields = {k.decode(): v.decode() for k, v in raw.items()}
            if fields.get("batch_id") != batch_id:
                continue
            try:
                rec = record_from_fields(fields)
            except InvalidCostRecord:
                continue
            by_pool[rec.pool] += Counters.of(rec)
        if len(entries) < chunk:
            break
        start = "(" + entries[-1][0].decode()
    return BatchSpend(batch.id, batch.tenant, batch.status, batch.total, dict(by_pool))


def render_batch_spend(spend: BatchSpend, fmt: str = "table") -> str:
    rows = [*sorted(spend.by_pool.items()), ("TOTAL", spend.total)]
    if fmt == "json":
        return orjson.dumps({"batch_id": spend.batch_id, "tenant": spend.tenant, "status": spend.status,
                             "lines": spend.lines, "rows": [_fields(name, c) for name, c in rows]},
                            option=orjson.OPT_INDENT_2).decode() + "\n"
    head = (f"batch {spend.batch_id} (tenant {spend.tenant}, {spend.status}, {spend.lines} lines): "
            f"{spend.total.requests} records\n")
    table = [("pool", "requests", "prompt", "completion", "cost", "flagship", "saving")]
    table += [(name, f"{c.requests:,}", f"{c.prompt_tokens:,}", f"{c.completion_tokens:,}", usd(c.cost_micro_usd),
               usd(c.flagship_cost_micro_usd), usd(c.flagship_cost_micro_usd - c.cost_micro_usd)) for name, c in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths,
                                                                                                    strict=True)))
             for row in table]
    return head + "\n".join(lines) + "\n"


def _fields(name: str, c: Counters) -> dict[str, Any]:
    return {"pool": name, "requests": c.requests, "prompt_tokens": c.prompt_tokens,
            "completion_tokens": c.completion_tokens, "cost_micro_usd": c.cost_micro_usd,
            "flagship_cost_micro_usd": c.flagship_cost_micro_usd,
            "saving_micro_usd": c.flagship_cost_micro_usd - c.cost_micro_usd}
