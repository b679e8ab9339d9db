"""The folder of prometheus_client's multiprocess mode (`cascade serve --workers N`): where it is, emptied before
the workers start, and a dead worker's live gauges dropped from it (`gateway.telemetry.metrics` says what is summed)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from prometheus_client import multiprocess

from gateway.telemetry.worker_gauges import remove_worker

__all__ = ["MULTIPROC_ENV", "multiprocess_dir", "prepare_multiprocess_dir", "worker_exited"]

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
"""prometheus_client reads it once, when it is imported: it must be in a worker's environment when it starts
(and in no other process's: a vLLM engine would write its own metrics there)."""


def multiprocess_dir() -> Path | None:
    """The folder of prometheus_client's multiprocess mode in this process (None: one process, in memory)."""
    value = os.environ.get(MULTIPROC_ENV)
    return Path(value) if value else None


def prepare_multiprocess_dir(path: Path) -> Path:
    """Empty `path` (what a previous run left there would be summed in) and return it. Called by the parent of
    the workers before it starts any; it then gives them `MULTIPROC_ENV=path`."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def worker_exited(pid: int, path: Path) -> None:
    """Drop the live gauges of a worker process that has exited (its counters stay in the sum)."""
    multiprocess.mark_process_dead(pid, str(path))  # type: ignore[no-untyped-call]
    remove_worker(pid, path)
