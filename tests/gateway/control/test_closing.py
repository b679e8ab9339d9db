"""Shutdown closes every pool, supervisor and engine whatever one of them does: a close that raises is logged with
its pool (and replica) and leaves no engine process behind. Engines here are small fake processes (each with a
child, as vLLM's API server has its engine core), run by the real supervisor."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from pathlib import Path

import pytest

from backends.clients.pool import Pool
from backends.clients.shared import Headers
from backends.engines.supervisor import Backoff, EngineSupervisor, live_group_members
from gateway.api.runtime import build_runtime
from gateway.control.engine_host import EngineHost
from gateway.control.fleet.pool_set import PoolSet
from gateway.settings import Settings
from policies.schema import EngineSpec
from tests.backends.engines.test_supervisor import FAKE_ENGINE
from tests.conftest import policy_yaml
from tests.servers import free_port


class _Client:
    """An engine client whose replicas all answer their health check."""

    async def get_text(self, url: str, timeout_s: float = 2.0, headers: Headers | None = None) -> str:
        return ""

    async def aclose(self) -> None:
        pass


class _StuckPool(Pool):
    """A pool whose close fails."""

    async def aclose(self) -> None:
        raise RuntimeError("probe task would not stop")


def supervisor(pool: str, home: Path, replicas: int = 1) -> EngineSupervisor:
    """The real supervisor running fake engines (`FAKE_ENGINE`: a health endpoint and a child process)."""
    spec = EngineSpec(model="fake", served_name=pool, replicas=replicas, base_port=free_port(), startup_timeout_s=60)

    def command(spec: EngineSpec, port: int, models_dir: Path) -> list[str]:
        return [sys.executable, "-c", FAKE_ENGINE, str(port), "serve"]

    return EngineSupervisor(pool, spec, home=home, command=command, check_interval_s=60, stop_grace_s=5,
                            backoff=Backoff(base_s=0.1, cap_s=1))


async def failed_restart(sup: EngineSupervisor, index: int) -> None:
    """Give replica `index` a restart task that has failed (a bug in a restart: the task ended with an error)."""
    async def restart() -> None:
        raise RuntimeError("restart failed")

    task = asyncio.create_task(restart(), name=f"restart of replica {index} of pool {sup.pool}")
    await asyncio.wait([task])
    sup.replicas[index].restart_task = task


def groups(*sups: EngineSupervisor) -> list[int]:
    pids = [r.pid for sup in sups for r in sup.replicas]
    assert pids and all(pid is not None for pid in pids)
    return [pid for pid in pids if pid is not None]


def kill_groups(pgids: list[int]) -> None:
    """What the old code left running, killed so that a failing test leaves nothing behind either."""
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


async def test_a_pool_and_a_supervisor_that_fail_to_close_leave_no_engine_running(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pool_set = PoolSet(Settings(policy_path=tmp_path / "unused.yaml", home=tmp_path, scorer="none"),
                       _Client())  # type: ignore[arg-type]
    broken, fine = supervisor("micro", tmp_path), supervisor("flagship", tmp_path, replicas=2)
    await asyncio.gather(broken.start(), fine.start())
    pgids = groups(broken, fine)
    try:
        assert all(len(live_group_members(g)) == 2 for g in pgids)  # each engine and its child run
        await failed_restart(broken, 0)
        pool_set.pools = {"micro": _StuckPool("micro", broken.urls, _Client()),  # type: ignore[arg-type]
                          "flagship": Pool("flagship", fine.urls, _Client())}  # type: ignore[arg-type]
        pool_set.supervisors = {"micro": broken, "flagship": fine}
        with caplog.at_level(logging.WARNING):
            await pool_set.aclose()
        assert [g for g in pgids if live_group_members(g)] == []  # no engine, no engine child left
        said = [r.getMessage() for r in caplog.records]
        assert any("closing pool micro failed" in m and "probe task would not stop" in m for m in said), said
        assert any("restart of replica 0 of pool micro" in m and "restart failed" in m for m in said), said
    finally:
        kill_groups(pgids)


async def test_a_replica_whose_stop_fails_is_logged_and_the_others_stop(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    sup = supervisor("micro", tmp_path, replicas=2)
    await sup.start()
    pgids = groups(sup)
    real_stop = sup._stop_replica

    async def stop(replica: object) -> None:
        if replica is sup.replicas[0]:
            raise OSError("permission denied")
        await real_stop(replica)  # type: ignore[arg-type]

    monkeypatch.setattr(sup, "_stop_replica", stop)
    try:
        with caplog.at_level(logging.WARNING):
            await sup.aclose()
        assert live_group_members(pgids[1]) == []  # the other replica stopped
        said = [r.getMessage() for r in caplog.records]
        assert any(f"closing replica 0 of pool micro (pid {pgids[0]}) failed" in m for m in said), said
    finally:
        kill_groups(pgids)


async def test_the_engine_host_logs_a_pool_set_that_fails_to_close_and_closes_the_rest(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml("http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1"))
    (tmp_path / "metrics").mkdir()
    host = EngineHost(Settings(policy_path=policy, home=tmp_path, scorer="none"), tmp_path / "registry",
                      tmp_path / "metrics", lambda spec, port, models: ["true"])
    client_closed = asyncio.Event()

    async def fails() -> None:
        raise RuntimeError("a supervisor would not stop")

    async def client_aclose() -> None:
        client_closed.set()

    monkeypatch.setattr(host.pool_set, "aclose", fails)
    monkeypatch.setattr(host._client, "aclose", client_aclose)
    with caplog.at_level(logging.WARNING):
        await host.aclose()
    assert client_closed.is_set()
    assert any("closing the pool set failed" in r.getMessage() and "would not stop" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]


async def test_the_gateway_closes_its_pools_though_an_earlier_part_fails_to_close(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml("http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1"))
    runtime = await build_runtime(Settings(policy_path=policy, home=tmp_path, scorer="none", start_engines=False,
                                           ledger="memory", access_log=None))
    pools_closed = asyncio.Event()
    close_pools = runtime.pool_set.aclose

    async def fails() -> None:
        raise RuntimeError("the ladder's Redis is gone")

    async def spy() -> None:
        await close_pools()
        pools_closed.set()

    monkeypatch.setattr(runtime.degradation, "aclose", fails)
    monkeypatch.setattr(runtime.pool_set, "aclose", spy)
    with caplog.at_level(logging.WARNING):
        await runtime.aclose()
    assert pools_closed.is_set()
    assert any("closing the degradation monitor failed" in r.getMessage() for r in caplog.records)
