"""The file watcher reads a changed file once it holds still: a policy written in place in two writes (truncate, then
the rest) is reloaded once, whole, and never rejected half written (a fresh clone's run once counted two rejected
reloads for one edit)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gateway.control.policy.file_watch import SETTLE_S, FileWatcher


async def test_a_file_written_in_two_steps_is_read_once_whole(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("version: 1\n")
    read: list[str] = []
    reloaded = asyncio.Event()

    async def reload() -> None:
        read.append(path.read_text())
        reloaded.set()

    watcher = FileWatcher([path], reload, interval_s=0.05)
    watcher.start()
    try:
        await asyncio.sleep(0.1)  # the watcher has its first stamps
        path.write_text("version: 2\n")  # the first half of an edit written in place
        await asyncio.sleep(SETTLE_S / 2)  # seen by the next look (0.05 s), still settling
        path.write_text("version: 2\nrouting: {threshold: 0.6}\n")
        await asyncio.wait_for(reloaded.wait(), timeout=30)
        await asyncio.sleep(3 * SETTLE_S)  # no second reload follows
    finally:
        await watcher.aclose()
    assert read == ["version: 2\nrouting: {threshold: 0.6}\n"]


async def test_a_file_that_never_holds_still_is_still_reloaded(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("0\n")
    reloaded = asyncio.Event()

    async def reload() -> None:
        reloaded.set()

    watcher = FileWatcher([path], reload, interval_s=0.05)
    watcher.start()

    async def keep_writing() -> None:
        for n in range(1, 1000):
            path.write_text(f"{n}\n" * (n % 7 + 1))
            await asyncio.sleep(SETTLE_S / 4)

    writer = asyncio.create_task(keep_writing())
    try:
        await asyncio.wait_for(reloaded.wait(), timeout=30)
    finally:
        writer.cancel()
        await watcher.aclose()
