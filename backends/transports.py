"""The names of the engine clients (`backends.engine_client.make_engine_client`), in one light module: the
CLI, the settings and the benchmarks list them without importing the HTTP libraries."""

from __future__ import annotations

from typing import Final, Literal, get_args

__all__ = ["DEFAULT_TRANSPORT", "TRANSPORTS", "Transport"]

Transport = Literal["h1", "aiohttp", "httpx"]
TRANSPORTS: Final[tuple[Transport, ...]] = get_args(Transport)
DEFAULT_TRANSPORT: Final[Transport] = "h1"
"""The default, by measurement (BENCHMARKS.md): the least gateway CPU per relayed token."""
