"""A serving process keeps off the cores the host's CPU engines compute on (`gateway.control.fleet.host_cores`).

Each case runs in a child process: binding pytest's own process would change where every later test runs. The
engines' cores are given (`taken`); that they are read off real worker processes is
tests/backends/engines/test_cpu_pinning.py's, and that `cascade serve` does it there too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
ALL_CPUS = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
needs_two_cpus = pytest.mark.skipif(len(ALL_CPUS) < 2, reason="needs Linux and at least 2 usable CPUs")

CASE = r"""
import json, os, sys, threading
from gateway.control.fleet.host_cores import EngineCoreAvoidance

taken = [frozenset(map(int, step)) for step in json.loads(sys.argv[1])]
seen = []
avoidance = EngineCoreAvoidance(taken=lambda allowed: taken.pop(0) & allowed)
for _ in range(len(taken)):
    cores = avoidance.check()
    thread_cores = []  # a thread started after the check inherits the binding
    worker = threading.Thread(target=lambda: thread_cores.append(sorted(os.sched_getaffinity(0))))
    worker.start()
    worker.join()
    seen.append({"cores": sorted(cores), "process": sorted(os.sched_getaffinity(0)), "thread": thread_cores[0]})
print(json.dumps(seen))
"""


def _run(steps: list[list[int]]) -> list[dict[str, list[int]]]:
    out = subprocess.run([sys.executable, "-c", CASE, json.dumps(steps)], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60, check=True)
    result: list[dict[str, list[int]]] = json.loads(out.stdout)
    return result


@needs_two_cpus
def test_a_process_moves_off_the_engines_cores_and_back_when_they_are_gone() -> None:
    first, rest = ALL_CPUS[0], ALL_CPUS[1:]
    seen = _run([[first], [], [first]])
    assert seen[0] == {"cores": rest, "process": rest, "thread": rest}
    assert seen[1] == {"cores": ALL_CPUS, "process": ALL_CPUS, "thread": ALL_CPUS}  # no CPU engine left
    assert seen[2]["process"] == rest


@needs_two_cpus
def test_engines_on_every_core_leave_the_process_on_every_core() -> None:
    assert _run([ALL_CPUS])[0] == {"cores": ALL_CPUS, "process": ALL_CPUS, "thread": ALL_CPUS}
