"""Stopping a background task for sure.

`task.cancel()` only asks. A library may swallow the request, and then the task runs on and whoever awaits
it waits forever. redis-py 8.1's asyncio client does this now and then when the cancellation lands in the
middle of a command: here, 1 in about 300 cancellations of a loop of EVAL and GET calls. A gateway whose
shared-ladder loop was hit this way never finished its shutdown after SIGTERM. `stop()` cancels again
until the task has ended, and a loop that may call such a library checks `cancel_requested()`: the
request stays on record (`Task.cancelling()`) even when the CancelledError itself was lost, for instance
turned into a connection error by the library and caught as one.

The background loops this is for hold no state that a second cancellation could leave half done.

`close_each` is the same care for a shutdown that closes several things (pools, engine supervisors): each is
closed whatever the others do, and each failure is logged with the name of what failed, never swallowed, never
stopping the rest.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

__all__ = ["Close", "cancel_once", "cancel_requested", "close_each", "stop"]

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


Close = tuple[str, Callable[[], Awaitable[object]]]
"""`(what, close)`: what is closed, named for the log ("pool micro"), and the call that closes it."""


async def close_each(closes: Sequence[Close], logger: logging.Logger = _log, in_turn: bool = False) -> list[str]:
    """Run every close, each whatever the others do: concurrently, or one after another in the given order
    (`in_turn`: a later one needs an earlier one done). Log each that fails (an exception, or a cancellation of its
    own) as "closing <what> failed", with its traceback. Returns the names that failed. Cancelling the caller
    cancels the closes still running."""
    async def run(close: Callable[[], Awaitable[object]]) -> object:
        return await close()  # a close that raises before its first await fails here too, as one of the results

    if in_turn:
        results: list[object] = []
        for _, close in closes:
            try:
                results.append(await run(close))
            except Exception as exc:
                results.append(exc)
    else:
        results = await asyncio.gather(*(run(close) for _, close in closes), return_exceptions=True)
    failed = []
    for (what, _), result in zip(closes, results, strict=True):
        if isinstance(result, BaseException):
            logger.error("closing %s failed: %s: %s", what, type(result).__name__, result, exc_info=result)
            failed.append(what)
    return failed


async def cancel_once(tasks: Sequence[asyncio.Task[Any]], logger: logging.Logger = _log) -> None:
    """Cancel each task once and wait for all of them, logging (with the task's name) each that had failed. For
    tasks whose cleanup runs in them on cancellation (a `finally` that stops engines), which a repeated cancellation
    (`stop`) would cut short."""
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks)
    for task in tasks:
        if not task.cancelled() and (exc := task.exception()) is not None:
            logger.error("%s failed: %s: %s", task.get_name(), type(exc).__name__, exc, exc_info=exc)
