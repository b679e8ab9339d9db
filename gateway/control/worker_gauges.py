"""Gauges that hold one worker's own view, published under `--workers N` with a `worker` label.

Some gauges describe state each worker process keeps for itself: a replica's circuit breaker and health (what
this worker's requests and probes saw, and so whether it routes there), the routing threshold it routes with
(refreshed from the shared window at its own moment). Summed or maxed over the workers they would mean nothing
a worker does; read at scrape time they show whichever worker answered. So in multiprocess mode each worker
collects them (`collectors`) and writes every sample, with `worker="<index>"` added, into its own file in the
metrics folder, `gauge_livemostrecent_<pid>.db` (prometheus_client's format, which `MultiProcessCollector`
merges: every series has one writer, the worker it names). The file is rewritten whole and renamed into
place, so a replica that left the pool leaves the exposition too, and a reader never sees half a file; the
parent deletes it when the worker exits (`multiprocess.mark_process_dead`, which removes a pid's `live*`
gauge files). No other gauge of the gateway uses `livemostrecent`, so the file is this module's alone.

`publish()` is called every second and before the worker renders `/metrics` (`GatewayMetrics.start`), so a
scrape shows each worker's view as of at most a second ago, whichever worker answers.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from pathlib import Path

from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.registry import Collector

__all__ = ["WORKER_ENV", "WorkerGauges", "worker_label"]

WORKER_ENV = "CASCADE_WORKER"
"""The worker's index under `serve --workers N` (set by `gateway.api.workers` for each worker it starts)."""
_MODE = "livemostrecent"


def worker_label() -> str:
    """This process's `worker` label: its index under `--workers`, else its pid."""
    return os.environ.get(WORKER_ENV) or str(os.getpid())


class WorkerGauges:
    """Publishes the gauges of `collectors` (read at each `publish`) for this worker into the metrics folder
    `path`. Owns its file."""

    def __init__(self, path: Path, collectors: Sequence[Collector]) -> None:
        self._path = path
        self._collectors = collectors
        self._worker = worker_label()
        self._file = path / f"gauge_{_MODE}_{os.getpid()}.db"

    def publish(self) -> None:
        """Write every gauge sample of the collectors, labelled with this worker, replacing the last file."""
        draft = self._path / f".{self._file.name}.draft"  # not *.db: the collector never reads a draft
        draft.unlink(missing_ok=True)
        out = MmapedDict(str(draft))  # type: ignore[no-untyped-call]
        now = time.time()
        try:
            for collector in self._collectors:
                for family in collector.collect():
                    if family.type != "gauge":
                        continue
                    for sample in family.samples:
                        names, values = [*sample.labels, "worker"], [*sample.labels.values(), self._worker]
                        key = mmap_key(family.name, sample.name, names, values, family.documentation)
                        out.write_value(key, sample.value, now)  # type: ignore[no-untyped-call]
        finally:
            out.close()  # type: ignore[no-untyped-call]
        os.replace(draft, self._file)

    def remove(self) -> None:
        """Remove this worker's file (it is leaving: its view goes with it)."""
        with contextlib.suppress(OSError):
            self._file.unlink(missing_ok=True)
