"""Load phases: `name:DURATIONs@RATE` (open loop: requests/s, `@A->B` ramps linearly) or, in closed-loop
mode, `@CONCURRENCY`. Example: `steady:20s@2,surge:30s@10,recover:30s@2`."""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Phase", "parse_phases"]

_PHASE = re.compile(r"^(?P<name>[\w.-]+):(?P<dur>\d+(?:\.\d+)?)s?@(?P<a>\d+(?:\.\d+)?)(?:->(?P<b>\d+(?:\.\d+)?))?$")


@dataclass(frozen=True, slots=True)
class Phase:
    """`start`/`end`: request rate (open loop) or concurrency (closed loop) at the phase's start and end."""

    name: str
    duration_s: float
    start: float
    end: float

    def level_at(self, elapsed_s: float) -> float:
        """The rate (or concurrency) `elapsed_s` into the phase, interpolated linearly."""
        if self.duration_s <= 0:
            return self.end
        frac = min(max(elapsed_s / self.duration_s, 0.0), 1.0)
        return self.start + (self.end - self.start) * frac


def parse_phases(text: str) -> list[Phase]:
    """Parse a comma-separated phase list. Raises ValueError naming the bad part and the format."""
    phases = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        match = _PHASE.match(part)
        if match is None:
            raise ValueError(f"bad phase {part!r}: use NAME:SECONDSs@RATE or NAME:SECONDSs@FROM->TO, "
                             "e.g. steady:20s@2 or ramp:10s@2->10")
        start = float(match["a"])
        phases.append(Phase(match["name"], float(match["dur"]), start, float(match["b"] or start)))
    if not phases:
        raise ValueError("no phases given")
    names = [p.name for p in phases]
    if len(set(names)) != len(names):
        raise ValueError(f"phase names must differ: {names}")
    return phases
