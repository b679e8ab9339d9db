"""Replica probes: the pool's health path, with the pool's headers (a remote API's key); a probe that raises is
counted and logged (rate-limited), and the pool's other replicas are probed all the same; an engine's `/metrics` is
scraped every probe only while something reads it."""

from __future__ import annotations

import asyncio
import logging

import pytest

from backends.clients.pool import BUSY_GRACE_S, IDLE_LOAD_PROBES, PROBE_ERROR_LOG_S, SLOW_PROBES_DOWN, Pool
from backends.clients.shared import EngineTimeout, EngineUnavailable, Headers


class _Probed:
    """An engine client that records GETs; `/v1/models` answers only with the right key."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Headers | None]] = []

    async def get_text(self, url: str, timeout_s: float = 2.0, headers: Headers | None = None) -> str:
        self.calls.append((url, headers))
        if url.endswith("/v1/models") and (headers or {}).get("authorization") == "Bearer k":
            return '{"data": []}'
        raise EngineUnavailable(f"{url}: HTTP 404")


def test_a_remote_pool_is_probed_on_its_health_path_with_its_key() -> None:
    client = _Probed()
    pool = Pool("cloud", ["https://api.example"], client, health_path="/v1/models",  # type: ignore[arg-type]
                headers={"authorization": "Bearer k"})
    asyncio.run(pool.probe_once())
    assert pool.ready
    assert client.calls[0] == ("https://api.example/v1/models", {"authorization": "Bearer k"})


def test_a_pool_whose_probe_fails_is_not_ready() -> None:
    pool = Pool("cloud", ["https://api.example"], _Probed(), headers={"authorization": "Bearer k"})  # type: ignore[arg-type]
    asyncio.run(pool.probe_once())  # /health does not exist there
    assert not pool.ready


class _Slow:
    """An engine client whose health check times out `slow` times, then answers."""

    def __init__(self, slow: int) -> None:
        self.slow = slow

    async def get_text(self, url: str, timeout_s: float = 2.0, headers: Headers | None = None) -> str:
        if url.endswith("/health") and self.slow > 0:
            self.slow -= 1
            raise EngineTimeout(f"{url}: no answer in {timeout_s:g} s")
        return ""


def test_a_saturated_engine_stays_in_rotation_until_several_health_checks_in_a_row_time_out() -> None:
    client = _Slow(slow=0)
    pool = Pool("micro", ["http://engine"], client)  # type: ignore[arg-type]
    asyncio.run(pool.probe_once())
    assert pool.ready
    client.slow = SLOW_PROBES_DOWN - 1
    for _ in range(SLOW_PROBES_DOWN - 1):  # slow, but it answers the next one: still serving
        asyncio.run(pool.probe_once())
        assert pool.ready
    asyncio.run(pool.probe_once())
    client.slow = SLOW_PROBES_DOWN
    for _ in range(SLOW_PROBES_DOWN):
        asyncio.run(pool.probe_once())
    assert not pool.ready  # that many in a row: down
    asyncio.run(pool.probe_once())
    assert pool.ready  # and back at the first answer


def test_slow_health_checks_do_not_take_out_a_replica_that_answers_traffic() -> None:
    now = [1000.0]
    client = _Slow(slow=0)
    pool = Pool("micro", ["http://engine"], client, clock=lambda: now[0])  # type: ignore[arg-type]
    asyncio.run(pool.probe_once())
    replica = pool.replicas[0]
    replica.breaker.record_success()  # a request just got its answer
    client.slow = 3 * SLOW_PROBES_DOWN
    for _ in range(2 * SLOW_PROBES_DOWN):
        asyncio.run(pool.probe_once())
    assert pool.ready  # saturated: /health is late, but real requests are answered
    now[0] += BUSY_GRACE_S  # no answered request since: the slow checks count again
    for _ in range(SLOW_PROBES_DOWN):
        asyncio.run(pool.probe_once())
    assert not pool.ready


class _Gated:
    """An engine client whose health check of `gated` waits for `open`; every other URL answers at once."""

    def __init__(self, gated: str) -> None:
        self.gated, self.open = gated, asyncio.Event()

    async def get_text(self, url: str, timeout_s: float = 2.0, headers: Headers | None = None) -> str:
        if url.startswith(self.gated):
            await self.open.wait()
        return ""


def test_a_pool_moved_to_new_ports_serves_from_the_old_ones_until_the_new_ones_answered() -> None:
    async def scenario() -> None:
        client = _Gated("http://new")
        pool = Pool("micro", ["http://old"], client)  # type: ignore[arg-type]
        await pool.probe_once()
        move = asyncio.create_task(pool.move_to(["http://new/"]))
        await asyncio.sleep(0.01)
        chosen = pool.choose()
        assert chosen is not None and chosen.url == "http://old"  # the new one is still being checked
        client.open.set()
        await move
        chosen = pool.choose()
        assert chosen is not None and chosen.url == "http://new" and [r.url for r in pool.replicas] == ["http://new"]

    asyncio.run(scenario())


class _BadMetrics:
    """An engine client: every replica is healthy; `bad`'s /metrics is a page that cannot be parsed."""

    def __init__(self, bad: str) -> None:
        self.bad = bad

    async def get_text(self, url: str, timeout_s: float = 2.0, headers: Headers | None = None) -> str:
        if url == self.bad + "/metrics":
            return 'vllm:num_requests_waiting{engine="0"} 1.2.3\n'
        if url.endswith("/metrics"):
            return 'vllm:num_requests_waiting{engine="0"} 7\n'
        return ""


def test_a_probe_that_raises_is_counted_logged_at_most_once_a_minute_and_spares_the_other_replicas(
        caplog: pytest.LogCaptureFixture) -> None:
    now, errors = [1000.0], []
    pool = Pool("micro", ["http://good", "http://bad"], _BadMetrics("http://bad"),  # type: ignore[arg-type]
                clock=lambda: now[0], on_probe_error=lambda *error: errors.append(error))
    with caplog.at_level(logging.ERROR, logger="cascade.pool"):
        for _ in range(3):
            asyncio.run(pool.probe_once())  # raised out of the probe loop before, where it was swallowed
            now[0] += 1.0
        good, bad = pool.replicas
        assert good.healthy and good.load.waiting == 7 and bad.load.waiting == 0  # the good one probed all the same
        assert errors == [("micro", "ValueError")] * 3
        assert len(caplog.records) == 1 and caplog.records[0].__dict__["replica"] == "http://bad"
        now[0] += PROBE_ERROR_LOG_S
        asyncio.run(pool.probe_once())
    assert len(caplog.records) == 2 and caplog.records[1].__dict__["probe_errors"] == 3  # two held back, and this
    assert caplog.records[1].exc_info is not None  # with its traceback


class _Scraped:
    """An engine client: every replica is healthy; counts the GETs of each replica's /metrics."""

    def __init__(self) -> None:
        self.scrapes: list[str] = []

    async def get_text(self, url: str, timeout_s: float = 2.0, headers: Headers | None = None) -> str:
        if url.endswith("/metrics"):
            self.scrapes.append(url.removesuffix("/metrics"))
            return 'vllm:num_requests_waiting{engine="0"} 3\n'
        return ""


def _scrapes(urls: list[str], read: bool, probes: int) -> tuple[_Scraped, Pool]:
    """`probes` probes of a pool of `urls` whose load something reads (`read`) or not."""
    client = _Scraped()
    pool = Pool("micro", urls, client, load_read=lambda: read)  # type: ignore[arg-type]
    for _ in range(probes):
        asyncio.run(pool.probe_once())
    return client, pool


def test_an_engines_metrics_nobody_reads_are_scraped_once_per_idle_interval_not_every_probe() -> None:
    client, pool = _scrapes(["http://a"], read=False, probes=30)
    assert len(client.scrapes) == 30 // IDLE_LOAD_PROBES  # 2, not 30
    assert pool.replicas[0].healthy and pool.replicas[0].load.waiting == 3  # the first probe scrapes


def test_metrics_are_scraped_every_probe_where_the_ladder_reads_them_or_replicas_are_chosen_by_them() -> None:
    assert len(_scrapes(["http://a"], read=True, probes=30)[0].scrapes) == 30
    assert len(_scrapes(["http://a", "http://b"], read=False, probes=30)[0].scrapes) == 60
