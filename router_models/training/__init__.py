"""Offline: real outcomes, targets, the fit, labels, leave-one-source-out evaluation, quality curves, thresholds."""
