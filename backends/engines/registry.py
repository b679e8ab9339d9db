"""Where a pool's engine replicas listen now, published by the process that supervises them for the gateway
processes that route to them (`cascade serve --workers N`: the parent runs the engines, the workers route).

One JSON file per pool in a folder, `{"urls": [...]}`, replaced atomically (write, rename), so a reader sees
the old list or the new one. The supervisor publishes at start and whenever a replica moves to another port.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

__all__ = ["REGISTRY_ENV", "publish", "published"]

REGISTRY_ENV = "CASCADE_ENGINE_REGISTRY"
"""The folder, as the parent of `--workers N` hands it to its workers."""


def publish(folder: Path, pool: str, urls: Sequence[str]) -> None:
    """Record that `pool`'s replicas listen on `urls` (base URLs, without /v1)."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{pool}.json.{os.getpid()}"
    tmp.write_text(json.dumps({"urls": list(urls)}))
    tmp.replace(folder / f"{pool}.json")


def published(folder: Path, pool: str) -> tuple[str, ...] | None:
    """The URLs last published for `pool`, or None where nothing (readable) was."""
    try:
        urls = json.loads((folder / f"{pool}.json").read_text())["urls"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return tuple(str(u) for u in urls) if isinstance(urls, list) else None
