"""What the gateway runs and how it adapts: the pool set, on-demand pools, the degradation ladder, the live
threshold, the policy holder and watcher, metrics."""
