"""Model files: the demo models built locally, real models shipped in PyPI wheels, `cascade models`."""
