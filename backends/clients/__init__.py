"""Talking to engines: the engine clients and their protocol, connections, circuit breakers, load-aware pools."""
