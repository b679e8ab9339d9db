"""Counters of faults the gateway absorbs in the background, never failing a request for them:

- `cascade_access_log_dropped_total{reason}`: access-log lines not written (`gateway.serving.line_writer`):
  `full` (the reader is slower than the traffic: the queue was full), `error` (a write failed), `shutdown` (still
  queued when the gateway stopped);
- `cascade_probe_errors_total{pool, kind}`: replica probes that went wrong (`backends.clients.pool`): `error` (the
  probe itself raised: a bug; the replica's state stays as it was), `metrics` (the engine's `/metrics` could not be
  read or parsed: its load figures stay as they were). A replica that is down is not a probe error: that is
  `cascade_replica_healthy`.

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
        self._probe_errors = Counter("cascade_probe_errors", "replica probes that went wrong, by pool and kind: "
                                     "error (the probe raised; the replica's state is stale), metrics (the engine's "
                                     "/metrics unreadable; its load figures are stale)", ["pool", "kind"],
                                     registry=registry)

    def access_log_dropped(self, reason: str, lines: int) -> None:
        """`gateway.serving.line_writer.DroppedHook` (called from the writer thread too)."""
        self._access_dropped.labels(reason).inc(lines)

    def probe_failed(self, pool: str, kind: str) -> None:
        """`backends.clients.pool.ProbeErrorHook`."""
        self._probe_errors.labels(pool, kind).inc()
