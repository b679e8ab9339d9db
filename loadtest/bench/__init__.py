"""Benchmarks: each prints figures measured side by side in one run (gateway overhead, engine clients,
peers, scorer, saturation)."""
