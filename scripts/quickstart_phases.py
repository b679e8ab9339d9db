"""Time the quick start's phases: a filter between ``cascade demo`` and the terminal.

Usage (from ``scripts/quickstart.sh``)::

    cascade demo ... | python scripts/quickstart_phases.py --started T0 --phase setup=S --phase models=M

It copies every line of the demo's output through unchanged and notes when each demo phase ended, from
the lines the demo prints: ``ready after N s`` (the engines are up), the first line after the routing
table's header (the first routed answer), end of input (the cost report printed). At end of input it
prints one line per phase with its duration, then the total since ``T0`` (a Unix time, seconds).
``--phase NAME=SECONDS`` lines come first: phases the shell timed itself (setup, models).

It ignores SIGINT: on Ctrl-C the demo stops its gateway and engines and says so, and that output must
still have somewhere to go. Stdlib only; the exit code is 0 unless the arguments are wrong.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TextIO

__all__ = ["PhaseClock", "main"]

_ENGINES_UP = "ready after "  # gateway.cli.demo._wait_ready
_TABLE_HEADER = "prompt "  # gateway.cli.demo._send_prompts: the header row of the routing table
_REPORT = "cost totals"  # gateway.cli.demo._print_costs


@dataclass
class PhaseClock:
    """Phase end times (monotonic) seen in the demo's output, from ``start`` (monotonic) on."""

    start: float
    ends: dict[str, float] = field(default_factory=dict)
    _after_header: bool = False

    def see(self, line: str, now: float) -> None:
        """Note the phase that ``line`` (seen at ``now``) ends, if any. The first sighting counts."""
        text = line.strip()
        if _ENGINES_UP in text:
            self.ends.setdefault("engines up", now)
        elif text.startswith(_TABLE_HEADER) and "pool" in text:
            self._after_header = True
        elif self._after_header and text and "first routed answer" not in self.ends:
            self.ends["first routed answer"] = now
        elif text.startswith(_REPORT):
            self.ends.setdefault("report start", now)

    def durations(self, end: float) -> list[tuple[str, float]]:
        """(phase, seconds) for the demo's phases, each from the end of the previous one; ``report`` runs
        from the first routed answer to ``end`` (all prompts sent, then the ledger's totals)."""
        out: list[tuple[str, float]] = []
        last = self.start
        for name in ("engines up", "first routed answer"):
            if name in self.ends:
                out.append((name, self.ends[name] - last))
                last = self.ends[name]
        if "first routed answer" in self.ends:
            out.append(("report", end - last))
        return out


def _copy(lines: Iterable[str], out: TextIO, clock: PhaseClock) -> None:
    for line in lines:
        clock.see(line, time.monotonic())
        out.write(line)
        out.flush()


def _table(rows: list[tuple[str, float]], total: float) -> str:
    body = "".join(f"  {name:<22} {seconds:7.1f} s\n" for name, seconds in rows)
    return f"\nquick start phases:\n{body}  {'total':<22} {total:7.1f} s ({total / 60:.1f} min)\n"


def _phase(text: str) -> tuple[str, float]:
    name, sep, seconds = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected NAME=SECONDS, got {text!r}")
    return name, float(seconds)


def main(argv: list[str] | None = None, stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--started", type=float, required=True, help="Unix time the quick start began")
    parser.add_argument("--phase", type=_phase, action="append", default=[], metavar="NAME=SECONDS")
    args = parser.parse_args(argv)
    clock = PhaseClock(start=time.monotonic())
    _copy(stdin, stdout, clock)
    now = time.monotonic()
    stdout.write(_table([*args.phase, *clock.durations(now)], time.time() - args.started))
    stdout.flush()
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(main())
