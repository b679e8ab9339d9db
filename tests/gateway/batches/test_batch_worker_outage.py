"""A batch worker whose Redis is down says so in one warning line (no traceback, which would read as a crash), keeps
trying, and says once that Redis answers again."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any, cast

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.batches.worker import BatchWorker


class _Store:
    """Raises as a client with no server does until `up`; then has no open batch."""

    def __init__(self) -> None:
        self.up = asyncio.Event()
        self.calls = 0

    async def validating_since(self, before: float) -> list[str]:
        return await self.open_ids()

    async def open_ids(self) -> list[str]:
        self.calls += 1
        if not self.up.is_set():
            raise RedisConnectionError("Error 111 connecting to redis:6390. Connection refused.")
        return []


def test_an_unreachable_redis_is_one_warning_without_a_traceback_then_one_line_when_it_answers(
        caplog: pytest.LogCaptureFixture) -> None:
    async def run() -> None:
        store = _Store()
        policies = SimpleNamespace(current=SimpleNamespace(policy=SimpleNamespace(
            batches=SimpleNamespace(claim_after_s=60, lines_in_flight=4))))
        none = cast(Any, None)
        worker = BatchWorker(cast(Any, store), none, none, none, cast(Any, policies), None, "w1", sweep_s=0.01)
        worker.start()
        while store.calls < 5:
            await asyncio.sleep(0.01)
        store.up.set()
        calls = store.calls
        while store.calls < calls + 6:  # two passes: sweep and take read the open batches 3 times a pass
            await asyncio.sleep(0.01)
        await worker.aclose()

    with caplog.at_level(logging.INFO, logger="cascade.batches"):
        asyncio.run(run())
    lines = [r for r in caplog.records if r.name == "cascade.batches"]
    assert [r.levelno for r in lines] == [logging.WARNING, logging.INFO]
    assert "Redis unreachable (Error 111 connecting to redis:6390" in lines[0].getMessage()
    assert "Redis answers again" in lines[1].getMessage()
    assert all(r.exc_info is None for r in lines)
