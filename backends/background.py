"""Stopping a background task for sure.

`task.cancel()` only asks. A library may swallow the request, and then the task runs on and whoever awaits
it waits forever. redis-py 8.1's asyncio client does this now and then when the cancellation lands in the
middle of a command: here, 1 in about 300 cancellations of a loop of EVAL and GET calls. A gateway whose
shared-ladder loop was hit this way never finished its shutdown after SIGTERM. `stop()` cancels again
until the task has ended, and a loop that may call such a library checks `cancel_requested()`: the
request stays on record (`Task.cancelling()`) even when the CancelledError itself was lost, for instance
turned into a connection error by the library and caught as one.

The background loops this is for hold no state that a second cancellation could leave half done.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

__all__ = ["cancel_requested", "stop"]

_log = logging.getLogger(__name__)
_RETRY_S = 0.5  # how long one cancellation is given before it is repeated


def cancel_requested() -> bool:
    """True once the running task has been asked to stop, even if the CancelledError was swallowed."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def stop(task: asyncio.Task[Any] | None, patience_s: float = 10.0) -> None:
    """Cancel `task` and wait until it has ended, cancelling again every 0.5 s in case a cancellation was
    swallowed. A failure of the task is logged, not raised. After `patience_s` it logs an error and returns
    with the task still running. Does nothing for None or a finished task."""
    if task is None:
        return
    deadline = time.monotonic() + patience_s
    while not task.done():
        task.cancel()
        await asyncio.wait((task,), timeout=_RETRY_S)
        if not task.done() and time.monotonic() >= deadline:
            _log.error("background task %s did not stop within %.0f s of being cancelled", task.get_name(),
                       patience_s)
            return
    if not task.cancelled() and (exc := task.exception()) is not None:
        _log.warning("background task %s had failed: %s: %s", task.get_name(), type(exc).__name__, exc)
