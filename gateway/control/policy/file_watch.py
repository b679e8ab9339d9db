"""Act when files change (polling their mtimes and sizes: no extra dependency, works on every filesystem,
including ConfigMap mounts that swap a symlink): the policy file, and the router artifact store."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from backends.background import stop
from gateway.control.fleet.pool_change import PolicyNotApplied
from policies.loader import PolicyError

__all__ = ["SETTLE_S", "FileWatcher"]

SETTLE_S = 0.2  # a changed file is read once its stamps (mtime, size) have held still this long
_MAX_SETTLES = 10  # then it is read as it is: a file rewritten without pause is still reloaded


def _stamp(path: Path) -> tuple[float, int] | None:
    try:
        st = os.stat(path)  # follows symlinks
    except OSError:
        return None
    return (st.st_mtime, st.st_size)


class FileWatcher:
    """Calls `reload()` after any file of `paths` changes (appears, is replaced or is removed). Owns one task
    (`start` / `aclose`). `what` names the reload in its logs ("policy", "router").

    A failed reload is logged (what runs stays) and not retried until a file changes again, except one that
    raised `PolicyNotApplied` (valid, but a pool's new replicas do not answer yet: pods still starting after a
    `kubectl apply`), which is tried again every `retry_s` until it applies or a file changes.
    """

    def __init__(self, paths: Sequence[Path], reload: Callable[[], Awaitable[object]], interval_s: float = 2.0,
                 what: str = "policy", retry_s: float = 15.0) -> None:
        self._retry_s = retry_s
        self._paths = tuple(paths)
        self._reload = reload
        self._interval = interval_s
        self._what = what
        self._log = logging.getLogger(f"cascade.{what}")
        self._task: asyncio.Task[None] | None = None

    def _stamps(self) -> tuple[tuple[float, int] | None, ...]:
        return tuple(_stamp(path) for path in self._paths)

    async def _loop(self) -> None:
        seen = self._stamps()
        retry_at: float | None = None
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self._interval)
            now = self._stamps()
            due = retry_at is not None and loop.time() >= retry_at
            if not due and (now == seen or all(s is None for s in now)):
                continue
            now = await self._settled(now)
            seen, retry_at = now, None
            try:
                await self._reload()
            except PolicyNotApplied as exc:
                retry_at = loop.time() + self._retry_s
                self._log.warning("%s file changed; it cannot be applied yet, trying again in %.0f s; the running "
                                  "%s stays", self._what, self._retry_s, self._what, extra={"problems": exc.problems})
            except PolicyError as exc:
                self._log.error("%s file changed but was rejected; the running %s stays. Fix the file (`cascade "
                                "policy validate FILE` lists every problem) or put the served version back; `cascade "
                                "policy status` shows both versions", self._what, self._what,
                                extra={"problems": exc.problems})
            except Exception as exc:
                self._log.error("%s reload failed; the running %s stays: %s", self._what, self._what, exc)

    async def _settled(self, now: tuple[tuple[float, int] | None, ...]) -> tuple[tuple[float, int] | None, ...]:
        """The files' stamps once they hold still for `SETTLE_S` (at most `_MAX_SETTLES` times): a file written in
        place (`cat > policy.yaml`, an editor that truncates then writes) was once read half written between its
        two writes, and its reload rejected and counted as a rejected edit, then applied at the next look."""
        for _ in range(_MAX_SETTLES):
            await asyncio.sleep(SETTLE_S)
            again = self._stamps()
            if again == now:
                break
            now = again
        return now

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name=f"{self._what}-watch")

    async def aclose(self) -> None:
        await stop(self._task)
        self._task = None
