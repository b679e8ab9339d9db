"""Policy reload, the parts the admin tests leave out: a local pool added by a reload starts its
engine and one removed stops it; a request in flight finishes on the policy (and the pool) it started
with even when the reload removes that pool; editing a pool under load loses no request.

Engines here are the fake upstream run as a real process by the real supervisor (only its command is
swapped), so the pool set's start / retire path is the one `cascade serve` runs."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path

import httpx
import pytest

from backends.engines.supervisor import EngineSupervisor
from gateway.api.app import create_app
from gateway.settings import Settings
from tests.servers import alive, fake_engine, free_port, serve, until

ADMIN = "audit-admin-key"
AUTH = {"authorization": f"Bearer {ADMIN}"}


def _local_pool(port: int) -> str:
    return f"""
  spare:
    type: local
    price: {{input_per_mtok: "0.10", output_per_mtok: "0.10"}}
    engine: {{model: fake-weights, served_name: spare-model, base_port: {port}, startup_timeout_s: 60}}
"""


def test_a_reload_starts_an_added_local_pool_and_stops_a_removed_one(
    policy_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    supervisor = functools.partial(EngineSupervisor, command=fake_engine, check_interval_s=0.2, stop_grace_s=5)
    monkeypatch.setattr("gateway.control.fleet.pool_set.EngineSupervisor", supervisor)
    good = policy_file.read_text()
    settings = Settings(policy_path=policy_file, scorer="length", start_engines=True, ledger="memory",
                        home=tmp_path, admin_key=ADMIN, policy_watch_interval_s=0)
    app = create_app(settings)
    with serve(app) as url:
        pool_set = app.state.runtime.pool_set
        policy_file.write_text(good.replace("pools:\n", "pools:" + _local_pool(free_port()), 1))
        assert httpx.post(url + "/admin/policy/reload", headers=AUTH).status_code == 200
        until(lambda: httpx.get(url + "/readyz").json()["pools"].get("spare") is True)
        (replica,) = pool_set.supervisors["spare"].replicas
        pid = replica.pid
        assert pid is not None and alive(pid)
        body = {"model": "spare", "messages": [{"role": "user", "content": "hi"}]}
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=10)
        assert r.status_code == 200 and r.headers["x-cascade-pool"] == "spare" and r.json()["model"] == "spare-model"

        policy_file.write_text(good)
        assert httpx.post(url + "/admin/policy/reload", headers=AUTH).status_code == 200
        assert "spare" not in httpx.get(url + "/readyz").json()["pools"]
        until(lambda: not alive(pid))  # the supervisor stopped the engine of the removed pool
        assert httpx.post(url + "/v1/chat/completions", json=body, timeout=10).status_code == 404


def _remote_pool(url: str) -> str:
    return f"""
  spare:
    type: remote
    urls: ["{url}"]
    model: spare-model
    price: {{input_per_mtok: "1.00", output_per_mtok: "1.00"}}
"""


async def test_a_request_in_flight_finishes_on_its_policy_when_the_reload_removes_its_pool(
    policy_file: Path, tmp_path: Path, upstreams: tuple[object, str, object, str]
) -> None:
    good = policy_file.read_text()
    policy_file.write_text(good.replace("pools:\n", "pools:" + _remote_pool(upstreams[3]), 1))
    settings = Settings(policy_path=policy_file, scorer="length", start_engines=False, ledger="memory",
                        home=tmp_path, admin_key=ADMIN, policy_watch_interval_s=0)
    body = {"model": "spare", "stream": True, "messages": [{"role": "user", "content": "hi"}],
            "metadata": {"fake_tokens": "20", "fake_delay_ms": "50"}}  # about a second of streaming
    with serve(create_app(settings)) as url:
        async with httpx.AsyncClient(timeout=30) as client:
            before = (await client.get(url + "/readyz")).json()["policy_version"]
            async with client.stream("POST", url + "/v1/chat/completions", json=body) as resp:
                assert resp.status_code == 200 and resp.headers["x-cascade-policy-version"] == before
                await asyncio.to_thread(policy_file.write_text, good)
                reloaded = await client.post(url + "/admin/policy/reload", headers=AUTH)
                assert reloaded.status_code == 200 and reloaded.json()["policy_version"] != before
                assert "spare" not in (await client.get(url + "/readyz")).json()["pools"]
                text = "".join([chunk async for chunk in resp.aiter_text()])
            assert " w19" in text and text.rstrip().endswith("data: [DONE]")
            late = await client.post(url + "/v1/chat/completions", json=dict(body, stream=False))
            assert late.status_code == 404  # a new request sees the new policy


async def test_editing_a_pool_under_load_loses_no_request(policy_file: Path, tmp_path: Path) -> None:
    settings = Settings(policy_path=policy_file, scorer="length", start_engines=False, ledger="memory",
                        home=tmp_path, admin_key=ADMIN, policy_watch_interval_s=0)
    good = policy_file.read_text()
    with serve(create_app(settings)) as url:
        async with httpx.AsyncClient(timeout=30) as client:
            done = asyncio.Event()

            async def traffic(worker: int) -> list[int]:
                codes = []
                body = {"model": "flagship", "stream": worker % 2 == 0, "messages": [{"role": "user", "content": "x"}]}
                while not done.is_set():  # requests keep arriving through every reload
                    codes.append((await client.post(url + "/v1/chat/completions", json=body)).status_code)
                return codes

            async def edit_prices() -> None:
                try:
                    for i in range(20):  # only the flagship's price changes: no engine needs to restart
                        text = good.replace('"15.00"', f'"{15 + i + 1}.00"')
                        await asyncio.to_thread(policy_file.write_text, text)
                        assert (await client.post(url + "/admin/policy/reload", headers=AUTH)).status_code == 200
                        await asyncio.sleep(0.05)
                finally:
                    done.set()

            results, _ = await asyncio.gather(asyncio.gather(*(traffic(w) for w in range(8))), edit_prices())
    codes = [c for worker in results for c in worker]
    assert len(codes) > 100 and [c for c in codes if c != 200] == []
