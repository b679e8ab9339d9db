"""The ledger prefixes that hold cost records on one Redis, for a report that found none under its own.

A gateway registers each UTC day it records under `{prefix}ledger:tenants:{day}` (`LedgerKeys.tenants_of_day`);
`ledger_prefixes` finds those keys with SCAN, so a report can name the prefixes (and their days) that do have
records instead of only saying that its own has none. SCAN walks the whole keyspace: it is only run for an empty
report, and stops after `budget_s` (the result then says it is partial). The caller owns the client.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["LedgerPrefix", "PrefixScan", "ledger_prefixes"]

_DAY_KEY = re.compile(r"^(?P<prefix>.*)ledger:tenants:(?P<day>\d{4}-\d{2}-\d{2})$")


@dataclass(frozen=True, slots=True)
class LedgerPrefix:
    """A prefix with records on `days` UTC days, the first `first` and the last `last` (YYYY-MM-DD)."""

    prefix: str
    first: str
    last: str
    days: int

    def words(self, own: str | None = None) -> str:
        """The prefix and its days; `own`: the prefix the report read, marked as such."""
        span = self.first if self.first == self.last else f"{self.first} .. {self.last}"
        return f"{self.prefix!r} ({span}{', outside the range read' if self.prefix == own else ''})"


@dataclass(frozen=True, slots=True)
class PrefixScan:
    """What `ledger_prefixes` found; `complete` is False when it stopped at its time budget."""

    found: tuple[LedgerPrefix, ...]
    complete: bool = True

    def sentence(self, own: str | None = None) -> str:
        """One sentence naming the prefixes with records, latest first (`own`, the prefix read, marked), or saying
        there is none."""
        more = "" if self.complete else " (the search stopped early: there may be more)"
        if not self.found:
            if not self.complete:
                return f"No other prefix with cost records was found on this Redis{more}."
            return ("This Redis holds no cost records under any prefix: a gateway writes them once it has answered "
                    "requests with its ledger in Redis (CASCADE_LEDGER=redis, the default).")
        shown = ", ".join(p.words(own) for p in self.found[:6])
        rest = len(self.found) - 6
        return (f"Cost records on this Redis are under {shown}{f' and {rest} more' if rest > 0 else ''}"
                f"{more}.")


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def ledger_prefixes(client: Any, budget_s: float = 3.0, count: int = 1000) -> PrefixScan:
    """Every prefix with a day registry on the Redis of `client`, the most recently written first; at most
    `budget_s` of SCAN (`count` keys a step)."""
    days: dict[str, list[str]] = {}
    deadline = time.monotonic() + budget_s
    complete = True
    async for raw in client.scan_iter(match="*ledger:tenants:*", count=count):
        if (match := _DAY_KEY.match(_text(raw))) is not None:
            days.setdefault(match["prefix"], []).append(match["day"])
        if time.monotonic() > deadline:
            complete = False
            break
    found = [LedgerPrefix(prefix, min(seen), max(seen), len(set(seen))) for prefix, seen in days.items()]
    found.sort(key=lambda p: (p.last, p.prefix), reverse=True)
    return PrefixScan(tuple(found), complete)
