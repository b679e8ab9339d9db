"""Under `--workers N` the parent stops a replica taken out of routing only once every live worker has shown it no
longer routes there: a view (`worker_gauges.worker_views`) written after the replica left routing that does not
hold it. A worker the machine stalls (no fresh view) is waited for, not assumed to have followed."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily

from backends.clients.pool import Replica
from gateway.control.fleet.draining import Drainer
from gateway.telemetry.metrics_dir import worker_exited
from gateway.telemetry.worker_gauges import HEALTHY, WorkerGauges, still_routing, worker_views

OLD, NEW = "http://127.0.0.1:8001", "http://127.0.0.1:8002"


class _View:
    def __init__(self, *urls: str) -> None:
        self.urls = urls

    def collect(self) -> list[GaugeMetricFamily]:
        family = GaugeMetricFamily(HEALTHY, "healthy", labels=["pool", "replica"])
        for url in self.urls:
            family.add_metric(["micro", url], 1.0)
        return [family]


def test_a_worker_routes_to_a_replica_until_a_view_written_after_the_change_drops_it(tmp_path: Path) -> None:
    view = _View(OLD)
    gauges = WorkerGauges(tmp_path, [view])
    gauges.publish()
    (seen,) = worker_views(tmp_path)
    assert seen.replicas == {OLD} and abs(seen.written - time.time()) < 60
    assert still_routing(worker_views(tmp_path), OLD, seen.written - 1) == 1  # its fresh view holds it
    view.urls = (NEW,)
    gauges.publish()
    since = worker_views(tmp_path)[0].written
    assert still_routing(worker_views(tmp_path), OLD, since) == 0  # followed: a fresh view without it
    assert still_routing(worker_views(tmp_path), OLD, since + 5) == 1  # no view since: it may not have followed
    worker_exited(os.getpid(), tmp_path)  # a worker that exited sends nothing
    assert worker_views(tmp_path) == [] and still_routing([], OLD, since + 5) == 0


def test_a_view_that_cannot_be_read_counts_as_one_that_may_still_route(tmp_path: Path) -> None:
    (tmp_path / "worker_gauges_123.json").write_text("{not json")
    (view,) = worker_views(tmp_path)
    assert view.written == 0.0 and still_routing([view], OLD, time.time() - 60) == 1


async def test_the_drain_waits_for_what_the_workers_hold_then_stops() -> None:
    held = {OLD: 1}
    calls: list[float] = []

    def elsewhere(url: str, since: float) -> int:
        calls.append(since)
        return held.get(url, 0)

    drain = asyncio.create_task(Drainer(grace_s=30.0, elsewhere=elsewhere).drained([Replica(OLD)]))
    while len(calls) < 3:  # it has looked, and keeps looking while a worker holds the replica
        await asyncio.sleep(0.05)
    assert not drain.done()
    held[OLD] = 0
    await asyncio.wait_for(drain, 5)
    assert len(set(calls)) == 1 and abs(calls[0] - time.time()) < 60  # one moment: when it left routing
