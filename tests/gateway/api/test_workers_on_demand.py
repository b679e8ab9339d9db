"""Scale to zero under `serve --workers 2`: the parent starts an on-demand pool's engine once, whichever workers
ask for it, every worker's requests wait for it and are answered, and it stops once no worker has used it for its
idle period; the next request wakes it again. The engine is the fake upstream (a real HTTP server process, started
and stopped by the real supervisor in the parent)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from gateway.api.workers import workers_problem
from gateway.settings import Settings
from tests.gateway.api.test_workers_restarts import Group, serve_group, workers_policy
from tests.servers import free_port, until

pytestmark = pytest.mark.redis
ROOT = Path(__file__).resolve().parents[3]
STALL_S = 30  # a 2-vCPU machine shared with engine tests stalls processes for seconds (see test_workers.py)


def _policy(engine_port: int) -> str:
    return workers_policy(engine_port, "    on_demand: {idle_stop_after_s: 2, cold_start_timeout_s: 60}\n")


@pytest.fixture
def group(tmp_path: Path) -> Iterator[Group]:
    yield from serve_group(tmp_path, _policy)


def _post(url: str) -> httpx.Response:
    body = {"model": "micro", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=STALL_S)  # a new connection each


def test_workers_accept_on_demand_pools(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(_policy(free_port()))
    assert workers_problem(Settings(policy_path=policy)) is None


def test_a_pool_asleep_for_two_workers_starts_once_serves_both_and_sleeps_when_idle(group: Group) -> None:
    assert group.engine_pids() == []  # asleep until a request needs it
    with ThreadPoolExecutor(8) as pool:  # 8 connections: the kernel spreads them over both workers
        answers = list(pool.map(lambda _: _post(group.url), range(8)))
    assert [a.status_code for a in answers] == [200] * 8, [a.text for a in answers if a.status_code != 200]
    assert len(group.engine_pids()) == 1  # one cold start for every request of every worker
    until(lambda: group.engine_pids() == [], timeout=STALL_S)  # no worker used it for 2 s: stopped
    again = _post(group.url)
    assert again.status_code == 200, again.text  # woken again, by whichever worker got it
    assert len(group.engine_pids()) == 1
