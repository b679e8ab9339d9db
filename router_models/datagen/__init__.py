"""Generators of the labelled prompt sets shipped under `router_models/data/` (deterministic, seeded)."""
