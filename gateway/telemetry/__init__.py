"""What a gateway process measures about itself, for `/metrics`: the registry and its collectors (`metrics`:
per cost record through `record_series`, per worker through `worker_gauges` and `metrics_dir`, the `--workers`
parent's `parent_counters`, speculation, the scorer's cuts), the collector's pauses (`gc_pauses`), the event
loop's lag, faults absorbed in the background, nearest-rank percentiles. A leaf: of the gateway it imports
only the ledger's record (`tests/test_layers.py`), so every package may import it."""
