"""Running engines: the local supervisor, each replica's argv, CPU pinning."""
