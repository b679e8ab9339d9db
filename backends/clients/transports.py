"""The names of the engine clients (`backends.clients.shared.make_engine_client`), in one light module: the
CLI, the settings and the benchmarks list them without importing the HTTP libraries.

The transport is chosen for plain-http engines on this host only (a loopback address: the engines the
supervisor starts). Every other engine (https, or another host) goes through aiohttp, whatever is chosen
here: a well-kept client with TLS, proxies and per-pool certificates (`backends.clients.connection`).
"""

from __future__ import annotations

from typing import Final, Literal, get_args

__all__ = ["DEFAULT_TRANSPORT", "KEEPALIVE_S", "TRANSPORTS", "Transport"]

Transport = Literal["h1", "aiohttp"]
TRANSPORTS: Final[tuple[Transport, ...]] = get_args(Transport)
DEFAULT_TRANSPORT: Final[Transport] = "h1"
"""The default for local engines, by measurement (BENCHMARKS.md, "Engine clients"): about a third less gateway
CPU per request than aiohttp against a zero-latency upstream."""
KEEPALIVE_S: Final = 4.0
"""Seconds an idle connection is kept for reuse: under the engine's own keep-alive (vLLM serves with uvicorn,
which closes idle connections after 5 s), so that a request is not written onto a connection being closed."""
