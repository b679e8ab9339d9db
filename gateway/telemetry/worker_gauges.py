"""Gauges that hold one worker's own view, published under `--workers N` with a `worker` label.

Some gauges describe state each worker process keeps for itself: a replica's circuit breaker and health (what
this worker's requests and probes saw, and so whether it routes there), the routing threshold it routes with
(refreshed from the shared window at its own moment). Summed or maxed over the workers they would mean nothing
a worker does; read at scrape time they show whichever worker answered. So in multiprocess mode each worker
collects them (`collectors`) and writes every sample, with `worker="<index>"` added, into its own file in the
metrics folder, `worker_gauges_<pid>.json`; every worker's render adds the files of all live workers
(`WorkerGaugesCollector`): every series has one writer, the worker it names. The file is rewritten whole and renamed
into place, so a replica that left the pool leaves the exposition too, and a reader never sees half a file; the
parent deletes it when the worker exits (`remove_worker`). prometheus_client's multiprocess collector reads only its
own `*.db` files, so it never sees these; only the public API of prometheus_client is used.

`publish()` is called every second and before the worker renders `/metrics` (`GatewayMetrics.start`), so a
scrape shows each worker's view as of at most a second ago, whichever worker answers.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["WORKER_ENV", "WorkerGauges", "WorkerGaugesCollector", "WorkerView", "published_gauges", "remove_worker",
           "still_routing", "worker_label", "worker_views"]

log = logging.getLogger("cascade.metrics")

WORKER_ENV = "CASCADE_WORKER"
"""The worker's index under `serve --workers N` (set by `gateway.api.workers` for each worker it starts)."""
_PREFIX = "worker_gauges_"
HEALTHY = "cascade_replica_healthy"
"""The view gauge that lists every replica a worker routes to (`gateway.telemetry.metrics`' `_ViewCollector`)."""


def worker_label() -> str:
    """This process's `worker` label: its index under `--workers`, else its pid."""
    return os.environ.get(WORKER_ENV) or str(os.getpid())


def _file_of(path: Path, pid: int) -> Path:
    return path / f"{_PREFIX}{pid}.json"


def remove_worker(pid: int, path: Path) -> None:
    """Remove the file of worker process `pid`, which has exited: its view leaves the exposition."""
    with contextlib.suppress(OSError):
        _file_of(path, pid).unlink(missing_ok=True)


@dataclass(frozen=True)
class WorkerView:
    """The replicas one live worker routes to (those in its `cascade_replica_healthy`) as of `written`, the
    wall-clock time it last published them."""

    written: float
    replicas: frozenset[str]


def worker_views(path: Path) -> list[WorkerView]:
    """Every live worker's last published view, read from the metrics folder `path` (a worker that exited has no
    file: the parent removes it). A file that cannot be read or parsed is a view of nothing written at 0, so a
    reader waiting for a fresh view keeps waiting rather than trusting it."""
    return [WorkerView(0.0, frozenset()) if isinstance(families, Exception) else
            WorkerView(written, frozenset(labels.get("replica", "") for name, _, samples in families
                                          if name == HEALTHY for labels, _ in samples))
            for _, written, families in published_gauges(path)]


def published_gauges(path: Path) -> Iterator[tuple[Path, float, Any]]:
    """Each live worker's file in the metrics folder `path`: the file, when it was written, and its gauge families
    (`WorkerGauges.publish`'s JSON), or the error that kept it from being read. A file whose worker exited between
    the listing and the read is left out."""
    for file in sorted(path.glob(f"{_PREFIX}*.json")):
        try:
            yield file, file.stat().st_mtime, json.loads(file.read_text())
        except FileNotFoundError:  # its worker exited meanwhile
            continue
        except (OSError, ValueError) as exc:
            yield file, 0.0, exc


def still_routing(views: Sequence[WorkerView], url: str, since: float) -> int:
    """Of `views`, the workers that may still send requests to the replica at `url`: those that have not published
    a view since `since` (wall-clock seconds), and those whose view still holds it."""
    return sum(1 for v in views if v.written < since or url in v.replicas)


class WorkerGauges:
    """Publishes the gauges of `collectors` (read at each `publish`) for this worker into the metrics folder
    `path`. Owns its file."""

    def __init__(self, path: Path, collectors: Sequence[Collector]) -> None:
        self._path = path
        self._collectors = collectors
        self._worker = worker_label()
        self._file = _file_of(path, os.getpid())

    def publish(self) -> None:
        """Write every gauge sample of the collectors, labelled with this worker, replacing the last file."""
        families = []
        for collector in self._collectors:
            for family in collector.collect():
                if family.type != "gauge":
                    continue
                samples = [[{**sample.labels, "worker": self._worker}, sample.value] for sample in family.samples]
                families.append([family.name, family.documentation, samples])
        draft = self._path / f".{self._file.name}.draft"
        draft.write_text(json.dumps(families))
        os.replace(draft, self._file)

    def remove(self) -> None:
        """Remove this worker's file (it is leaving: its view goes with it)."""
        with contextlib.suppress(OSError):
            self._file.unlink(missing_ok=True)


class WorkerGaugesCollector(Collector):
    """The gauges every worker published in the metrics folder `path`, read at each scrape."""

    def __init__(self, path: Path) -> None:
        self._path = path

    def collect(self) -> Iterable[Metric]:
        merged: dict[str, tuple[GaugeMetricFamily, list[str]]] = {}  # by name: the family, its label names
        for file, _, families in published_gauges(self._path):
            if isinstance(families, Exception):
                log.warning("could not read a worker's gauges from %s: %s", file, families)
                continue
            for name, doc, samples in families:
                for labels, value in samples:
                    if name not in merged:
                        merged[name] = GaugeMetricFamily(name, doc, labels=list(labels)), list(labels)
                    family, names = merged[name]
                    family.add_metric([labels.get(k, "") for k in names], value)
        return [family for family, _ in merged.values()]
