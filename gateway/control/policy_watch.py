"""Reload the policy when its file changes (polling its mtime and size: no extra dependency, works on
every filesystem, including ConfigMap mounts that swap a symlink)."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

from backends.background import stop
from policies.loader import PolicyError

__all__ = ["PolicyWatcher"]

log = logging.getLogger("cascade.policy")


def _stamp(path: Path) -> tuple[float, int] | None:
    try:
        st = os.stat(path)  # follows symlinks
    except OSError:
        return None
    return (st.st_mtime, st.st_size)


class PolicyWatcher:
    """Calls `reload()` after the file at `path` changes. Owns one task (`start` / `aclose`).

    A failed reload is logged (the running policy stays) and not retried until the file changes again.
    """

    def __init__(self, path: Path, reload: Callable[[], Awaitable[object]], interval_s: float = 2.0) -> None:
        self._path = path
        self._reload = reload
        self._interval = interval_s
        self._task: asyncio.Task[None] | None = None

    async def _loop(self) -> None:
        seen = _stamp(self._path)
        while True:
            await asyncio.sleep(self._interval)
            now = _stamp(self._path)
            if now is None or now == seen:
                continue
            seen = now
            try:
                await self._reload()
            except PolicyError as exc:
                log.error("policy file changed but was rejected; the running policy stays",
                          extra={"problems": exc.problems})
            except Exception:
                log.exception("policy reload failed; the running policy stays")

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="policy-watch")

    async def aclose(self) -> None:
        await stop(self._task)
        self._task = None
