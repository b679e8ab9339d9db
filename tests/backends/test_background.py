"""`stop()`: a background task ends even when a cancellation is swallowed (as redis-py sometimes does)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from backends.background import cancel_requested, stop


async def test_a_task_that_swallows_one_cancellation_still_stops() -> None:
    swallowed = 0

    async def stubborn() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed += 1  # what redis-py 8.1 does now and then mid-command: carry on

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    await asyncio.wait_for(stop(task), 5)
    assert task.cancelled() and swallowed == 1


async def test_a_task_that_never_stops_is_given_up_on_with_an_error(caplog: pytest.LogCaptureFixture) -> None:
    deaf_for_now = True

    async def deaf() -> None:
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                if not deaf_for_now:
                    raise

    task = asyncio.create_task(deaf(), name="deaf")
    await asyncio.sleep(0)
    with caplog.at_level(logging.ERROR):
        await asyncio.wait_for(stop(task, patience_s=0.6), 5)
    assert not task.done()
    assert "background task deaf did not stop" in caplog.text
    deaf_for_now = False
    await stop(task)
    assert task.cancelled()


async def test_a_failed_task_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    async def broken() -> None:
        raise ValueError("boom")

    task = asyncio.create_task(broken(), name="broken")
    await asyncio.sleep(0)
    with caplog.at_level(logging.WARNING):
        await stop(task)
        await stop(None)
    assert "background task broken had failed: ValueError: boom" in caplog.text


async def test_a_loop_sees_a_cancellation_that_a_library_turned_into_an_error() -> None:
    rounds = 0

    async def loop() -> None:
        nonlocal rounds
        while not cancel_requested():
            rounds += 1
            try:
                try:
                    await asyncio.sleep(10)
                except asyncio.CancelledError as exc:  # what redis-py does mid-command, now and then
                    raise ConnectionError("Connection lost") from exc
            except ConnectionError:
                continue

    task = asyncio.create_task(loop())
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.wait_for(task, 2)
    assert rounds == 1 and task.done() and not task.cancelled()
