"""The policy file beside the policy served: whether they match, how the last reload ended, and the metrics of both.

Every gateway process (each worker under `--workers N`) reloads the file itself (its watcher, or
`POST /admin/policy/reload` to the worker that answers), so each holds its own `PolicyFile` and says only what it
knows: the version it serves and since when, the version the file holds now (the same content hash as
`policies.loader`, read again at each look: a few KB), and the last reload's error. A file that no longer matches
the policy served (an edit the reload rejected, one not applied yet, or one not looked at yet) makes `/readyz`
"degraded" (200: the process serves the policy it served before), never "not ready".

Metrics (`attach`): `cascade_policy_reloads_total{result}` (counted by the process that reloaded: under `--workers`
one edit counts once per worker) with `result` one of `applied` (a new version is served), `unchanged` (the file
holds the version served), `rejected` (an invalid file, or a change refused: the policy served stays),
`not_applied` (valid, but a pool's new replicas do not answer yet: tried again) and `failed` (any other error); and,
per worker (a `worker` label under `--workers`, `gateway.telemetry.worker_gauges`),
`cascade_policy_served_timestamp_seconds{version}` (UTC epoch when this process began serving that version) and
`cascade_policy_file_matches` (1 while the file holds the version served).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.control.fleet.pool_change import PolicyNotApplied
from gateway.telemetry.metrics import GatewayMetrics
from policies.loader import LoadedPolicy, PolicyError

__all__ = ["RESULTS", "PolicyFile", "ReloadError", "file_version", "refusal"]

Result = Literal["applied", "unchanged", "rejected", "not_applied", "failed"]
RESULTS: tuple[Result, ...] = ("applied", "unchanged", "rejected", "not_applied", "failed")


def file_version(path: str | Path) -> str | None:
    """The version `policies.loader` gives the file at `path` now (its content hash), None when it cannot be read."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def refusal(exc: BaseException, source: str, served: str) -> tuple[Result, str]:
    """How a reload of `source` that raised `exc` ended, and what it means and what to do, in one message (the
    admin endpoint's error, the watcher's log line, `/readyz`'s `last_error`); `served`: the version that stays."""
    if isinstance(exc, PolicyNotApplied):
        return "not_applied", (f"the policy in {source} is valid but cannot be applied yet (see problems); version "
                               f"{served} still serves. The file watcher tries it again by itself; reload again once "
                               "the pools' new replicas answer (or as a problem says)")
    if isinstance(exc, PolicyError):
        return "rejected", (f"the policy in {source} was rejected (see problems); version {served} still serves. "
                            f"Fix the file (`cascade policy validate {source}` lists every problem) and reload "
                            "again, or put the served version back")
    return "failed", (f"reloading the policy in {source} failed (see problems and the gateway log); version "
                      f"{served} still serves. Fix the cause and reload again")


@dataclass(frozen=True, slots=True)
class ReloadError:
    """A reload that did not serve the file: when (UTC epoch s), the result, the message and every problem."""

    at: float
    result: Result
    message: str
    problems: tuple[str, ...]

    def public(self) -> dict[str, Any]:
        return {"at": self.at, "result": self.result, "message": self.message, "problems": list(self.problems)}


class PolicyFile:
    """This process's view of its policy file (see the module docstring). `current` gives the policy served;
    `clock` is UTC epoch seconds (tests move it). Used from one event loop."""

    def __init__(self, current: Callable[[], LoadedPolicy], clock: Callable[[], float] = time.time) -> None:
        self._current = current
        self._clock = clock
        self._served_version = current().version
        self.served_since = clock()
        self.last_error: ReloadError | None = None
        self.last_reload_at: float | None = None
        self._counter: Counter | None = None

    def attach(self, metrics: GatewayMetrics) -> None:
        """Count reloads in `metrics` and publish this process's gauges there (see the module docstring)."""
        self._counter = Counter("cascade_policy_reloads", "policy reloads by result: applied, unchanged, rejected, "
                                "not_applied, failed (each process counts its own)", ["result"],
                                registry=metrics.registry)
        for result in RESULTS:
            self._counter.labels(result)
        metrics.register_scrape_time(_Gauges(self), own_view=True)

    def succeeded(self, loaded: LoadedPolicy) -> None:
        """A reload ended serving `loaded` (a new version, or the one served already)."""
        changed = loaded.version != self._served_version
        if changed:
            self._served_version, self.served_since = loaded.version, self._clock()
        self.last_error = None
        self._count("applied" if changed else "unchanged")

    def failed(self, exc: BaseException) -> None:
        """A reload raised `exc`: the policy served stays."""
        result, message = refusal(exc, self._current().source, self._served_version)
        problems = tuple(exc.problems) if isinstance(exc, PolicyError) else (str(exc),)
        self.last_error = ReloadError(self._clock(), result, message, problems)
        self._count(result)

    def _count(self, result: Result) -> None:
        self.last_reload_at = self._clock()
        if self._counter is not None:
            self._counter.labels(result).inc()

    def state(self) -> dict[str, Any]:
        """What `/readyz` shows under `policy`: `matches_file` False makes readiness "degraded", and `reason` says
        why in words (None while the file matches)."""
        loaded = self._current()
        on_disk = file_version(loaded.source)
        return {"source": loaded.source, "served_version": loaded.version, "served_since": self.served_since,
                "file_version": on_disk, "matches_file": on_disk == loaded.version,
                "last_reload_at": self.last_reload_at,
                "last_error": None if self.last_error is None else self.last_error.public(),
                "reason": self._reason(loaded, on_disk)}

    def _reason(self, loaded: LoadedPolicy, on_disk: str | None) -> str | None:
        if on_disk == loaded.version:
            return None
        if on_disk is None:
            return (f"the policy file {loaded.source} cannot be read; version {loaded.version} still serves. Put the "
                    "file back (the gateway reads it again by itself)")
        if self.last_error is not None:
            return f"the policy file holds version {on_disk}: {self.last_error.message}"
        return (f"the policy file {loaded.source} holds version {on_disk}, not applied here yet; version "
                f"{loaded.version} still serves. The file watcher applies it at its next look (POST "
                "/admin/policy/reload with the admin key: now)")


class _Gauges(Collector):
    """The per-worker policy gauges, read at scrape time."""

    def __init__(self, state: PolicyFile) -> None:
        self._state = state

    def collect(self) -> Iterable[Metric]:
        state = self._state.state()
        served = GaugeMetricFamily("cascade_policy_served_timestamp_seconds", "UTC epoch seconds when this process "
                                   "began serving the policy version it serves (label version)", labels=["version"])
        served.add_metric([state["served_version"]], state["served_since"])
        yield served
        yield GaugeMetricFamily("cascade_policy_file_matches", "1 while the policy file holds the version this "
                                "process serves (0: an edit rejected, not applied or not looked at yet)",
                                value=1.0 if state["matches_file"] else 0.0)
