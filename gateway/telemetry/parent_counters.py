"""The counters of the `--workers N` parent: engine restarts and autoscaler changes, counted once for the host.

The parent supervises and scales the engines but serves no `/metrics`, and its environment must not carry
`PROMETHEUS_MULTIPROC_DIR` (the engines inherit it). So it keeps its counts in one JSON file of the workers' shared
metrics folder, `parent_counters.json` (`ParentCounters`), rewritten whole on each change (written beside, then
renamed over: a reader sees the old file or the new one, never half of one). Every worker's `render()` adds them
to the exposition (`ParentCountersCollector`). prometheus_client's multiprocess collector reads only its own
`*.db` files there, so the two never count the same sample; only the public API of prometheus_client is used.

The counts are the host's: the next run's `prepare_multiprocess_dir` empties the folder, as for the workers'.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["PARENT_FILE", "RESTARTS", "SCALE_EVENTS", "ParentCounters", "ParentCountersCollector"]

log = logging.getLogger("cascade.metrics")

PARENT_FILE = "parent_counters.json"
RESTARTS = ("cascade_engine_restarts", "local engine replicas restarted by the supervisor, by reason: exited (the "
            "process died) or hung (alive, but it answered no health check or request for the pool's "
            "hang_restart_after_s)", ("pool", "reason"))
SCALE_EVENTS = ("cascade_scale_events", "autoscaler changes of a pool's replicas: direction up or down, outcome "
                "done, no_room, start_failed or failed (any other error; the pool keeps its replicas)",
                ("pool", "direction", "outcome"))
_FAMILIES = {name: (doc, labels) for name, doc, labels in (RESTARTS, SCALE_EVENTS)}


class ParentCounters:
    """Counts of the parent, kept in `path / PARENT_FILE`. Used from one thread (the parent's event loop); owns
    no open file. Its methods are the `backends.engines.supervisor.RestartHook` and the
    `gateway.control.fleet.autoscale.ScaleEvent` of the parent."""

    def __init__(self, path: Path) -> None:
        self._file = path / PARENT_FILE
        self._counts: dict[str, dict[tuple[str, ...], float]] = {name: {} for name in _FAMILIES}

    def engine_restarted(self, pool: str, index: int, reason: str) -> None:
        self._add(RESTARTS[0], (pool, reason))

    def scale_event(self, pool: str, direction: str, outcome: str) -> None:
        self._add(SCALE_EVENTS[0], (pool, direction, outcome))

    def _add(self, name: str, labels: tuple[str, ...]) -> None:
        counts = self._counts[name]
        counts[labels] = counts.get(labels, 0.0) + 1.0
        text = json.dumps({n: [[*k, v] for k, v in c.items()] for n, c in self._counts.items()})
        part = self._file.with_suffix(".part")
        try:
            part.write_text(text)
            os.replace(part, self._file)
        except OSError as exc:  # a full disk must not stop the engines' supervision: the count is kept in memory
            log.warning("could not write the parent's counters to %s: %s", self._file, exc)


class ParentCountersCollector(Collector):
    """The parent's counters, read from `path / PARENT_FILE` at each scrape (nothing while it does not exist)."""

    def __init__(self, path: Path) -> None:
        self._file = path / PARENT_FILE

    def collect(self) -> Iterable[Metric]:
        try:
            counts = json.loads(self._file.read_text())
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            log.warning("could not read the parent's counters from %s: %s", self._file, exc)
            return []
        families = []
        for name, rows in counts.items():
            if name not in _FAMILIES or not rows:
                continue
            doc, labels = _FAMILIES[name]
            family = CounterMetricFamily(name, doc, labels=labels)
            for *values, value in rows:
                family.add_metric(values, value)
            families.append(family)
        return families
