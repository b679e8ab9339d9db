"""The suite's CPU accounting (tests/cpu_per_test.py): a child's CPU is counted, the summary adds it up."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.cpu_per_test import summary, tree_cpu


def test_a_reaped_childs_cpu_is_counted() -> None:
    before = tree_cpu()
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"
    subprocess.run([sys.executable, "-c", burn], check=True)
    assert tree_cpu() - before >= 0.25


def test_the_summary_sums_by_directory_worker_and_file(tmp_path: Path) -> None:
    rows = {"gw0": [("tests/e2e/test_a.py::t1", 10.0, 20.0), ("tests/e2e/test_a.py::t2", 5.0, 5.0)],
            "gw1": [("tests/gateway/api/test_b.py::t", 1.5, 3.0), ("tests/test_top.py::t", 0.5, 1.0)]}
    for worker, tests in rows.items():
        (tmp_path / f"{worker}.jsonl").write_text(
            "".join(json.dumps({"id": i, "cpu": c, "wall": w}) + "\n" for i, c, w in tests))
    text = summary(tmp_path)
    assert "| tests/e2e | 25 | 15 |" in text and "| tests/gateway | 3 | 2 |" in text
    assert "| tests (top level) | 1 | 0 |" in text and "worker wall (s): gw0 25, gw1 4" in text
    lines = text.splitlines()
    first = lines.index("costliest 15 files by CPU (core-s):") + 1
    assert [line.split() for line in lines[first:]] == [
        ["15.0", "tests/e2e/test_a.py"], ["1.5", "tests/gateway/api/test_b.py"], ["0.5", "tests/test_top.py"]]
