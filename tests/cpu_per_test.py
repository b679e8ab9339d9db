"""CPU per test, its child processes included: where the suite's core-seconds go (BENCHMARKS.md, "Test suite").

Opt in: `./scripts/test.sh -p tests.cpu_per_test` writes one JSON line per test (`id`, `cpu` core-seconds, `wall`
seconds, setup to teardown) per pytest-xdist worker into `$CASCADE_TEST_CPU_DIR` (default `.cascade/test-cpu`);
`python -m tests.cpu_per_test [DIR]` sums them by directory and lists the costliest files.

A test's CPU is that of its worker's process tree at its end less at its start: the worker itself, children it
reaped (their own reaped children included) and live descendants. A descendant killed with its group before its
parent reaped it (an engine's core and worker, stopped with the API server's group) is lost, so engine tests read
low: the machine's busy time (`/proc/stat`) is the total to compare with.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from collections.abc import Generator
from pathlib import Path

import psutil
import pytest

OUT_ENV = "CASCADE_TEST_CPU_DIR"


def _out_dir() -> Path:
    return Path(os.environ.get(OUT_ENV) or Path(__file__).resolve().parents[1] / ".cascade" / "test-cpu")


def tree_cpu() -> float:
    """Core-seconds of this process, its reaped children and its live descendants."""
    t = os.times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in psutil.Process().children(recursive=True):
        try:
            c = child.cpu_times()
        except psutil.Error:
            continue
        total += c.user + c.system + c.children_user + c.children_system
    return total


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    cpu, wall = tree_cpu(), time.monotonic()
    yield
    row = {"id": item.nodeid, "cpu": round(tree_cpu() - cpu, 2), "wall": round(time.monotonic() - wall, 2)}
    out = _out_dir()
    out.mkdir(parents=True, exist_ok=True)
    with (out / f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.jsonl").open("a") as fh:
        fh.write(json.dumps(row) + "\n")


def summary(folder: Path, top: int = 15) -> str:
    """Wall and CPU by test directory, each worker's wall, and the `top` costliest files by CPU."""
    rows = [json.loads(line) | {"worker": f.stem} for f in sorted(folder.glob("*.jsonl"))
            for line in f.read_text().splitlines() if line]
    by_dir: Counter[str] = Counter()
    cpu_dir: Counter[str] = Counter()
    cpu_file: Counter[str] = Counter()
    workers: Counter[str] = Counter()
    for row in rows:
        path = row["id"].split("::")[0]
        parts = path.split("/")
        directory = "/".join(parts[:2]) if len(parts) > 2 else "tests (top level)"
        by_dir[directory] += row["wall"]
        cpu_dir[directory] += row["cpu"]
        cpu_file[path] += row["cpu"]
        workers[row["worker"]] += row["wall"]
    lines = ["| directory | wall (s) | CPU (core-s) |", "|---|---|---|"]
    lines += [f"| {d} | {w:,.0f} | {cpu_dir[d]:,.0f} |" for d, w in by_dir.most_common()]
    lines += ["", "worker wall (s): " + ", ".join(f"{w} {s:,.0f}" for w, s in sorted(workers.items())), "",
              f"costliest {top} files by CPU (core-s):"]
    lines += [f"  {c:7.1f}  {path}" for path, c in cpu_file.most_common(top)]
    return "\n".join(lines)


if __name__ == "__main__":
    print(summary(Path(sys.argv[1]) if len(sys.argv) > 1 else _out_dir()))
