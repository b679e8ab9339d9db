"""The batches' series in `/metrics` (beside `gateway.telemetry.metrics.GatewayMetrics`, which is full).

`cascade_batch_lines_total{status}`: lines this process handled: "completed" and "failed" (answered 2xx or not),
"requeued" (no headroom, preempted, or a transient refusal: back on the queue), "skipped" (its batch cancelled or
expired), "duplicate" (answered again after a reclaim; the first answer stays).
`cascade_batch_lane_in_flight{pool}`: batch lines in the lane on each pool now; `cascade_batch_lane_waiting`: lines
waiting for headroom now; `cascade_batch_lines_preempted_total{pool}`: lines an interactive request took their pool
back from while they ran (`batches.preempt`; each also counted "requeued").
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["BatchMetrics"]


class BatchMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.lines = Counter("cascade_batch_lines", "batch lines this process handled, by status: completed, failed, "
                             "requeued, skipped, duplicate", ["status"], registry=registry)
        # summed over the live workers under `cascade serve --workers N` (prometheus_client's multiprocess mode)
        self.lane = Gauge("cascade_batch_lane_in_flight", "batch lines in the low-priority lane per pool",
                          ["pool"], registry=registry, multiprocess_mode="livesum")
        self.waiting = Gauge("cascade_batch_lane_waiting", "batch lines waiting for their pool's headroom",
                             registry=registry, multiprocess_mode="livesum")
        self.preempted = Counter("cascade_batch_lines_preempted", "batch lines cancelled on their pool for an "
                                 "interactive request and put back on the queue", ["pool"], registry=registry)

    def line(self, status: str) -> None:
        self.lines.labels(status).inc()

    def lane_changed(self, pool: str, in_flight: int) -> None:
        self.lane.labels(pool).set(in_flight)

    def waiting_changed(self, lines: int) -> None:
        self.waiting.set(lines)

    def line_preempted(self, pool: str) -> None:
        self.preempted.labels(pool).inc()
