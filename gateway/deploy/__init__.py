"""Kubernetes rendering: values and manifests, the CLI."""
