"""The `cascade` command: the entry point, serve, the demo, router threshold calibration, output helpers."""
