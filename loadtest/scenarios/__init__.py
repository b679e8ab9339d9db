"""Load scenarios of the serving path (surge, slow or dead engines, chaos) on fake or real engines
(`python -m loadtest.scenarios`)."""
