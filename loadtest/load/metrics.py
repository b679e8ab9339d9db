"""Reading a gateway's Prometheus `/metrics` during a load run: which degradation steps are active, and
sums of counters (e.g. micro-USD recorded) to take differences over a run."""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field

import aiohttp

__all__ = ["LadderWatch", "active_steps", "counter_sum", "samples", "scrape"]

_LINE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
LADDER_GAUGE = "cascade_degradation_active"


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample line of a Prometheus text exposition."""
    out = []
    for line in text.splitlines():
        match = _LINE.match(line)
        if match is None or line.startswith("#"):
            continue
        labels = dict(_LABEL.findall(match["labels"] or ""))
        try:
            out.append((match["name"], labels, float(match["value"])))
        except ValueError:
            continue
    return out


def active_steps(text: str) -> list[str]:
    """Names of the ladder steps whose `cascade_degradation_active` gauge is 1."""
    return sorted(lb.get("step", "") for name, lb, v in samples(text) if name == LADDER_GAUGE and v >= 1)


def counter_sum(text: str, name: str, **match: str) -> float:
    """Sum of a counter's samples (`name` with or without `_total`) whose labels include `match`."""
    names = {name, name + "_total"}
    return sum(v for n, lb, v in samples(text) if n in names and all(lb.get(k) == w for k, w in match.items()))


async def scrape(session: aiohttp.ClientSession, url: str) -> str | None:
    """The body of `url`, or None when it cannot be read (the run goes on without it)."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as resp:
            return await resp.text() if resp.status == 200 else None
    except (aiohttp.ClientError, TimeoutError):
        return None


@dataclass
class LadderWatch:
    """Polls `/metrics` every `interval_s` and keeps a timeline of (seconds since start, active steps)."""

    url: str
    interval_s: float = 1.0
    timeline: list[tuple[float, list[str]]] = field(default_factory=list)
    first: str | None = None
    last: str | None = None

    async def run(self, session: aiohttp.ClientSession, t0: float, stop: asyncio.Event) -> None:
        while True:
            text = await scrape(session, self.url)
            if text is not None:
                self.first = self.first or text
                self.last = text
                self.timeline.append((round(time.monotonic() - t0, 2), active_steps(text)))
            try:
                await asyncio.wait_for(stop.wait(), self.interval_s)
                text = await scrape(session, self.url)
                self.last = text or self.last
                return
            except TimeoutError:
                continue

    @property
    def engaged(self) -> list[str]:
        """Every step seen active at some point of the run."""
        return sorted({s for _, steps in self.timeline for s in steps})
