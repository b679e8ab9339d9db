"""The policy series of a running gateway's `/metrics`, for `cascade policy status`.

`/readyz` is one process's answer; under `cascade serve --workers N` any worker's `/metrics` holds every live
worker's view (`gateway.control.policy.policy_file`): `cascade_policy_served_timestamp_seconds{version,worker}` and
`cascade_policy_file_matches{worker}` one series per worker, and `cascade_policy_reloads_total{result}` summed over
them. So `status` reads both, and a worker whose file no longer matches shows whichever worker answered `/readyz`.
A single process's series carry no `worker` label (shown as worker "-").

`/metrics` behind a key (`CASCADE_METRICS_KEY`, "admin" for the admin key): the key is read from the same
environment variables the gateway reads (`CASCADE_METRICS_KEY`, then `CASCADE_ADMIN_KEY` where it says "admin").
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["PolicySeries", "WorkerPolicy", "parse_policy_series", "read_policy_series", "series_lines"]

_RESULTS = ("applied", "unchanged", "rejected", "not_applied", "failed")


@dataclass(frozen=True, slots=True)
class WorkerPolicy:
    """One worker's view: the version it serves and since when (UTC epoch s), and whether the file holds it."""

    worker: str
    version: str | None = None
    since: float | None = None
    matches: bool | None = None


@dataclass(frozen=True, slots=True)
class PolicySeries:
    """Reloads by result (summed over the workers) and each worker's view, by worker."""

    reloads: dict[str, float]
    workers: tuple[WorkerPolicy, ...]

    @property
    def all_match(self) -> bool:
        return all(w.matches is not False for w in self.workers)


def _key() -> str | None:
    key = os.environ.get("CASCADE_METRICS_KEY") or None
    return os.environ.get("CASCADE_ADMIN_KEY") or None if key == "admin" else key


def parse_policy_series(text: str) -> PolicySeries:
    """The policy series of one exposition text."""
    reloads: dict[str, float] = {}
    views: dict[str, WorkerPolicy] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            worker = sample.labels.get("worker", "-")
            view = views.get(worker, WorkerPolicy(worker))
            if sample.name == "cascade_policy_reloads_total":
                result = sample.labels.get("result", "?")
                reloads[result] = reloads.get(result, 0.0) + sample.value
            elif sample.name == "cascade_policy_served_timestamp_seconds":
                views[worker] = WorkerPolicy(worker, sample.labels.get("version"), sample.value, view.matches)
            elif sample.name == "cascade_policy_file_matches":
                views[worker] = WorkerPolicy(worker, view.version, view.since, sample.value >= 1)
    return PolicySeries(reloads, tuple(views[w] for w in sorted(views)))


def read_policy_series(url: str) -> PolicySeries | str:
    """The gateway's policy series, or why `/metrics` could not be read (with what to do)."""
    key = _key()
    headers = {"authorization": f"Bearer {key}"} if key else {}
    try:
        reply = httpx.get(url.rstrip("/") + "/metrics", headers=headers, timeout=10.0)
    except httpx.HTTPError as exc:
        return f"cannot read {url}/metrics: {exc}"
    if reply.status_code == 401:
        return (f"{url}/metrics needs a key: set CASCADE_METRICS_KEY (or CASCADE_ADMIN_KEY where the gateway's "
                "CASCADE_METRICS_KEY is \"admin\") as the gateway has it")
    if reply.status_code != 200:
        return f"{url}/metrics answered {reply.status_code}"
    try:
        return parse_policy_series(reply.text)
    except ValueError as exc:
        return f"{url}/metrics is not a Prometheus exposition: {exc}"


def _when(epoch: float | None) -> str:
    return "-" if epoch is None else datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def series_lines(series: PolicySeries) -> list[str]:
    """The lines `status` prints for the policy series: reloads by result, then one line per worker."""
    counts = ", ".join(f"{r} {series.reloads.get(r, 0):g}" for r in _RESULTS)
    lines = [f"reloads:       {counts} (since start, summed over the workers)"]
    for view in series.workers:
        state = {True: "file matches", False: "file does NOT match", None: "file not known"}[view.matches]
        lines.append(f"worker {view.worker}:{' ' * max(1, 7 - len(view.worker))}serves {view.version or '-'} since "
                     f"{_when(view.since)}, {state}")
    return lines
