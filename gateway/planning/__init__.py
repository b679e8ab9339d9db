"""Capacity planning: the forecast schema, the capacity model, the CLI."""
