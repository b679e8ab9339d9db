"""Counters of faults the gateway absorbs in the background, never failing a request for them:

- `cascade_access_log_dropped_total{reason}`: access-log lines not written (`gateway.serving.records.line_writer`):
  `full` (the reader is slower than the traffic: the queue was full), `error` (a write failed), `shutdown` (still
  queued when the gateway stopped);
- `cascade_probe_errors_total{pool, error}`: replica probes that raised (`backends.clients.pool`: a bug, or an
  engine's `/metrics` that cannot be parsed), by the exception's type; the replica's state stays as the last good
  probe left it. A replica that is down or slow is not a probe error: that is `cascade_replica_healthy`.

Under `--workers N` they are counters of the workers' shared folder, summed; the parent's own probes (for the
autoscaler) are logged, not counted here: the workers probe the same replicas with the same code.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

__all__ = ["BackgroundFaults"]


class BackgroundFaults:
    """The counters in a gateway's registry; its methods are the hooks of the access log and the pools."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._access_dropped = Counter("cascade_access_log_dropped", "access-log lines not written, by reason: "
                                       "full (the reader is slower than the traffic), error (the write failed), "
                                       "shutdown (still queued at exit)", ["reason"], registry=registry)
        self._probe_errors = Counter("cascade_probe_errors", "replica probes that raised (a bug, an engine /metrics "
                                     "that cannot be parsed), by pool and exception type: the replica's state is "
                                     "stale", ["pool", "error"], registry=registry)

    def access_log_dropped(self, reason: str, lines: int) -> None:
        """`gateway.serving.records.line_writer.DroppedHook` (called from the writer thread too)."""
        self._access_dropped.labels(reason).inc(lines)

    def probe_failed(self, pool: str, error: str) -> None:
        """`backends.clients.pool.ProbeErrorHook`."""
        self._probe_errors.labels(pool, error).inc()
