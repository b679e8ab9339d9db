"""The load tool: an open- or closed-loop load generator for any OpenAI-compatible endpoint
(`python -m loadtest.load`)."""
