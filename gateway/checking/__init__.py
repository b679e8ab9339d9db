"""Output checks: what a pool answered, judged against what the request asked for (`policies.output_checks`)."""
