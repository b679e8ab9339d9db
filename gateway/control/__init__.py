"""What the gateway runs and how it adapts, by concern: `fleet` (the pool set, engine versions, canaries,
replicas, draining, autoscaling, on-demand pools), `adaptation` (the degradation ladder, the live threshold
and tradeoff), `policy` (the running policy, its file, reloads); `engine_host` (the `--workers` parent)
composes them. Metrics are in `gateway.telemetry`. Nothing here imports `gateway.serving`, and the
sub-packages import each other only as `tests/test_layers.py` allows."""
