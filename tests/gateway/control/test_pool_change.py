"""Changing a running pool's engines: blue-green under load (no request lost, streams included), a new engine
that does not start (the old one keeps serving and the reload says why), no room beside the old version
(refused, with how long the pool would be dark, unless the interruption is accepted), and a replica that
restarts on another port because its own was taken (the pool follows it).

Engines are the fake upstream run as real processes by the real supervisor (only its command is swapped),
so the pool set's start / swap / drain path is the one `cascade serve` runs. The same change on real vLLM
engines is `tests/e2e/test_pool_change_real.py`."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path

import httpx
import pytest

from backends.engines.room import GIB, Gpu, Room, Usage, judge_room
from backends.engines.supervisor import EngineSupervisor
from gateway.api.app import create_app
from gateway.control.fleet.pool_change import plan_change
from gateway.settings import Settings
from loadtest.fake_upstream import FakeUpstream
from policies.schema import EngineSpec
from tests.servers import alive, fake_engine, free_port, serve, until

ADMIN = "pool-change-admin-key"
AUTH = {"authorization": f"Bearer {ADMIN}"}
BODY = {"model": "spare", "messages": [{"role": "user", "content": "hi"}]}


def _engine(spec: EngineSpec, port: int, models_dir: Path) -> list[str]:
    if spec.model == "broken-weights":  # an engine that cannot load its model: says why and exits
        return [sys.executable, "-c", "import sys; print('OSError: no weights in broken-weights'); sys.exit(3)"]
    return fake_engine(spec, port, models_dir)


def _pool(port: int, max_model_len: int = 1024, model: str = "fake-weights", replicas: int = 1) -> str:
    return f"""
  spare:
    type: local
    price: {{input_per_mtok: "0.10", output_per_mtok: "0.10"}}
    engine: {{model: {model}, served_name: spare-model, base_port: {port}, max_model_len: {max_model_len},
              startup_timeout_s: 30, replicas: {replicas}}}
"""


@pytest.fixture
def gateway(policy_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str, Settings]:
    supervisor = functools.partial(EngineSupervisor, command=_engine, check_interval_s=0.2, stop_grace_s=5)
    monkeypatch.setattr("gateway.control.fleet.pool_set.EngineSupervisor", supervisor)
    base = policy_file.read_text()
    port = free_port()
    policy_file.write_text(base.replace("pools:\n", "pools:" + _pool(port), 1))
    settings = Settings(policy_path=policy_file, scorer="length", start_engines=True, ledger="memory",
                        home=tmp_path, admin_key=ADMIN, policy_watch_interval_s=0)
    return policy_file, base, settings


def _spare_ready(url: str) -> bool:
    return httpx.get(url + "/readyz").json()["pools"].get("spare") is True


def _edit(policy_file: Path, old: str, new: str) -> None:
    text = policy_file.read_text()
    assert old in text
    policy_file.write_text(text.replace(old, new, 1))


async def test_a_changed_pool_starts_beside_the_old_one_and_loses_no_request(
    gateway: tuple[Path, str, Settings],
) -> None:
    policy_file, _, settings = gateway
    app = create_app(settings)
    with serve(app) as url:
        pool_set = app.state.runtime.pool_set
        await asyncio.to_thread(until, lambda: _spare_ready(url))
        (old,) = pool_set.supervisors["spare"].replicas
        old_pid = old.pid
        assert old_pid is not None
        async with httpx.AsyncClient(timeout=30) as client:
            done = asyncio.Event()

            window: list[float] = []  # when the reload was sent and when it answered

            async def traffic(worker: int) -> list[tuple[float, str]]:
                outcomes = []
                stream = worker % 2 == 0
                body = BODY | {"stream": stream, "metadata": {"fake_tokens": "8", "fake_delay_ms": "20"}}
                while not done.is_set():
                    r = await client.post(url + "/v1/chat/completions", json=body)
                    ok = r.status_code == 200 and (not stream or r.text.rstrip().endswith("data: [DONE]"))
                    outcomes.append((time.monotonic(), "ok" if ok else f"{r.status_code} {r.text[:200]}"))
                return outcomes

            async def change() -> httpx.Response:
                try:
                    await asyncio.sleep(0.5)
                    await asyncio.to_thread(_edit, policy_file, "max_model_len: 1024", "max_model_len: 2048")
                    window.append(time.monotonic())
                    reloaded = await client.post(url + "/admin/policy/reload", headers=AUTH)
                    window.append(time.monotonic())
                    return reloaded
                finally:
                    await asyncio.sleep(0.5)  # traffic on the new version too
                    done.set()

            results, reloaded = await asyncio.gather(asyncio.gather(*(traffic(w) for w in range(4))), change())
        assert reloaded.status_code == 200, reloaded.text
        outcomes = [o for worker in results for o in worker]
        assert [o for _, o in outcomes if o != "ok"] == []
        during = [at for at, _ in outcomes if window[0] < at < window[1]]
        after = [at for at, _ in outcomes if at > window[1]]
        assert len(during) >= 4 and after  # answered while the new version started, and by it
        sup = pool_set.supervisors["spare"]
        (new,) = sup.replicas
        assert sup.generation == 1 and sup.spec.max_model_len == 2048 and new.pid != old_pid
        assert [r.url for r in pool_set.pools["spare"].replicas] == [new.url]
        assert new.log_path.name == "spare.g1-0.log"
        assert "version 1" in httpx.get(url + "/readyz").json()["engines"]["spare"]
        await asyncio.to_thread(until, lambda: not alive(old_pid))  # drained, then stopped


async def test_a_stream_in_flight_finishes_on_the_old_version(gateway: tuple[Path, str, Settings]) -> None:
    policy_file, _, settings = gateway
    app = create_app(settings)
    with serve(app) as url:
        await asyncio.to_thread(until, lambda: _spare_ready(url))
        (old,) = app.state.runtime.pool_set.supervisors["spare"].replicas
        body = BODY | {"stream": True, "metadata": {"fake_tokens": "40", "fake_delay_ms": "50"}}  # ~2 s
        async with httpx.AsyncClient(timeout=30) as client, client.stream(
            "POST", url + "/v1/chat/completions", json=body
        ) as resp:
            assert resp.status_code == 200
            await asyncio.to_thread(_edit, policy_file, "max_model_len: 1024", "max_model_len: 2048")
            assert (await client.post(url + "/admin/policy/reload", headers=AUTH)).status_code == 200
            assert old.pid is not None and alive(old.pid)  # still draining the stream
            text = "".join([chunk async for chunk in resp.aiter_text()])
        assert " w39" in text and text.rstrip().endswith("data: [DONE]")


def test_a_new_engine_that_fails_leaves_the_old_one_serving(gateway: tuple[Path, str, Settings]) -> None:
    policy_file, _, settings = gateway
    app = create_app(settings)
    with serve(app) as url:
        until(lambda: _spare_ready(url))
        pool_set = app.state.runtime.pool_set
        (old,) = pool_set.supervisors["spare"].replicas
        before = httpx.get(url + "/readyz").json()["policy_version"]
        _edit(policy_file, "model: fake-weights", "model: broken-weights")
        r = httpx.post(url + "/admin/policy/reload", headers=AUTH, timeout=60)
        assert r.status_code == 422
        problems = " ".join(r.json()["error"]["problems"])
        assert "the old one keeps serving" in problems and "no weights in broken-weights" in problems
        assert httpx.get(url + "/readyz").json()["policy_version"] == before
        assert pool_set.supervisors["spare"].replicas == (old,) and old.pid is not None and alive(old.pid)
        assert httpx.post(url + "/v1/chat/completions", json=BODY, timeout=10).status_code == 200


def test_no_room_is_refused_unless_the_interruption_is_accepted(
    gateway: tuple[Path, str, Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    policy_file, _, settings = gateway
    monkeypatch.setattr("gateway.control.fleet.version_change.judge_room",
                        lambda spec, model_dir: Room(0, "memory: full"))
    app = create_app(settings)
    with serve(app) as url:
        until(lambda: _spare_ready(url))
        pool_set = app.state.runtime.pool_set
        (old,) = pool_set.supervisors["spare"].replicas
        _edit(policy_file, "max_model_len: 1024", "max_model_len: 2048")
        refused = httpx.post(url + "/admin/policy/reload", headers=AUTH, timeout=60)
        assert refused.status_code == 422
        (problem,) = refused.json()["error"]["problems"]
        assert "memory: full" in problem and "no replica for about" in problem and "accept_interruption" in problem
        assert pool_set.supervisors["spare"].replicas == (old,) and pool_set.specs["spare"].engine.max_model_len == 1024

        accepted = httpx.post(url + "/admin/policy/reload?accept_interruption=true", headers=AUTH, timeout=60)
        assert accepted.status_code == 200, accepted.text
        until(lambda: _spare_ready(url))
        (new,) = pool_set.supervisors["spare"].replicas
        assert new.pid != old.pid and pool_set.specs["spare"].engine.max_model_len == 2048
        assert httpx.post(url + "/v1/chat/completions", json=BODY, timeout=10).status_code == 200


async def test_where_only_one_new_replica_fits_the_pool_is_replaced_one_at_a_time(
    gateway: tuple[Path, str, Settings], monkeypatch: pytest.MonkeyPatch,
) -> None:
    policy_file, _, settings = gateway
    policy_file.write_text(policy_file.read_text().replace("startup_timeout_s: 30, replicas: 1",
                                                           "startup_timeout_s: 30, replicas: 3"))
    monkeypatch.setattr("gateway.control.fleet.version_change.judge_room", lambda spec, model_dir: Room(1, "memory: x"))
    app = create_app(settings)
    with serve(app) as url:
        pool_set = app.state.runtime.pool_set
        await asyncio.to_thread(until, lambda: _spare_ready(url))
        old_pids = [r.pid for r in pool_set.supervisors["spare"].replicas]
        async with httpx.AsyncClient(timeout=30) as client:
            done = asyncio.Event()
            seen: list[str] = []

            async def traffic(worker: int) -> list[str]:
                outcomes = []
                body = BODY | {"stream": worker % 2 == 0, "metadata": {"fake_tokens": "8", "fake_delay_ms": "20"}}
                while not done.is_set():
                    r = await client.post(url + "/v1/chat/completions", json=body)
                    ok = r.status_code == 200 and (not body["stream"] or r.text.rstrip().endswith("data: [DONE]"))
                    outcomes.append("ok" if ok else f"{r.status_code} {r.text[:200]}")
                return outcomes

            async def watch() -> None:
                while not done.is_set():
                    seen.append(httpx.get(url + "/readyz").json()["engines"]["spare"])
                    await asyncio.sleep(0.1)

            async def change() -> httpx.Response:
                try:
                    await asyncio.sleep(0.3)
                    _edit(policy_file, "max_model_len: 1024", "max_model_len: 2048")
                    return await client.post(url + "/admin/policy/reload", headers=AUTH, timeout=90)
                finally:
                    await asyncio.sleep(0.3)
                    done.set()

            results, _, reloaded = await asyncio.gather(asyncio.gather(*(traffic(w) for w in range(4))), watch(),
                                                        change())
        assert reloaded.status_code == 200, reloaded.text
        assert [o for worker in results for o in worker if o != "ok"] == []
        assert any("rolling: 2 of 3 replicas on the new version" in s for s in seen), sorted(set(seen))
        sup = pool_set.supervisors["spare"]
        assert len(sup.replicas) == 3 and sup.spec.max_model_len == 2048
        assert {r.url for r in pool_set.pools["spare"].replicas} == set(sup.urls)
        assert all(pid is not None for pid in old_pids)
        # each drained, then stopped: the last one's exit may be reaped a moment after the reload answered
        await asyncio.to_thread(until, lambda: not any(alive(pid) for pid in old_pids if pid is not None))


async def test_a_rolling_change_that_fails_half_way_puts_the_old_version_back(
    gateway: tuple[Path, str, Settings], monkeypatch: pytest.MonkeyPatch,
) -> None:
    policy_file, _, settings = gateway
    policy_file.write_text(policy_file.read_text().replace("startup_timeout_s: 30, replicas: 1",
                                                           "startup_timeout_s: 30, replicas: 2"))
    monkeypatch.setattr("gateway.control.fleet.version_change.judge_room", lambda spec, model_dir: Room(1, "memory: x"))
    new_starts = []

    def second_new_one_fails(spec: EngineSpec, port: int, models_dir: Path) -> list[str]:
        if spec.max_model_len == 2048:
            new_starts.append(port)
            if len(new_starts) == 2:
                return [sys.executable, "-c", "import sys; print('OSError: out of memory'); sys.exit(3)"]
        return fake_engine(spec, port, models_dir)

    supervisor = functools.partial(EngineSupervisor, command=second_new_one_fails, check_interval_s=0.2,
                                   stop_grace_s=5)
    monkeypatch.setattr("gateway.control.fleet.pool_set.EngineSupervisor", supervisor)
    app = create_app(settings)
    with serve(app) as url:
        pool_set = app.state.runtime.pool_set
        await asyncio.to_thread(until, lambda: _spare_ready(url))
        old_sup = pool_set.supervisors["spare"]
        async with httpx.AsyncClient(timeout=30) as client:
            _edit(policy_file, "max_model_len: 1024", "max_model_len: 2048")
            reloaded = await client.post(url + "/admin/policy/reload", headers=AUTH, timeout=90)
            assert reloaded.status_code == 422
            assert "out of memory" in " ".join(reloaded.json()["error"]["problems"])
            assert pool_set.supervisors["spare"] is old_sup and len(old_sup.replicas) == 2  # one started again
            assert {r.url for r in pool_set.pools["spare"].replicas} == set(old_sup.urls)
            replies = [await client.post(url + "/v1/chat/completions", json=BODY) for _ in range(6)]
        assert [r.status_code for r in replies] == [200] * 6
        assert pool_set.specs["spare"].engine.max_model_len == 1024


def test_a_replica_restarted_on_another_port_is_followed(gateway: tuple[Path, str, Settings]) -> None:
    _, _, settings = gateway
    app = create_app(settings)
    with serve(app) as url:
        until(lambda: _spare_ready(url))
        pool_set = app.state.runtime.pool_set
        (replica,) = pool_set.supervisors["spare"].replicas
        port, pid = replica.port, replica.pid
        assert pid is not None
        os.killpg(pid, signal.SIGKILL)
        holder = socket.socket()
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        until(lambda: _bound(holder, port), timeout=10)  # the port is taken before the engine restarts
        try:
            until(lambda: replica.port != port and replica.ready)
            assert [r.url for r in pool_set.pools["spare"].replicas] == [replica.url]
            until(lambda: _spare_ready(url))
            r = httpx.post(url + "/v1/chat/completions", json=BODY, timeout=10)
            assert r.status_code == 200 and r.headers["x-cascade-pool"] == "spare"
        finally:
            holder.close()


def _bound(sock: socket.socket, port: int) -> bool:
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        return False
    sock.listen()
    return True


def test_the_plan_for_each_case() -> None:
    room = Room(1, "memory: x")
    blue = plan_change("p", runs_engines=True, serving=True, replicas=1, room=room, last_start_s=26,
                       accept_interruption=False)
    assert not isinstance(blue, str) and blue.how == "blue-green"
    refused = plan_change("p", runs_engines=True, serving=True, replicas=2, room=room, last_start_s=26,
                          accept_interruption=False)
    assert isinstance(refused, str) and "room for 1 of the 2" in refused and "about 26 s" in refused
    rolling = plan_change("p", runs_engines=True, serving=True, replicas=2, room=room, last_start_s=26,
                          accept_interruption=False, old_replicas=2)
    assert not isinstance(rolling, str) and rolling.how == "rolling" and "replaced 1 at a time" in rolling.why
    renamed = plan_change("p", runs_engines=True, serving=True, replicas=2, room=room, last_start_s=26,
                          accept_interruption=False, old_replicas=2, same_name=False)
    assert isinstance(renamed, str)  # both versions would serve at once under two names: refused
    accepted = plan_change("p", runs_engines=True, serving=True, replicas=2, room=room, last_start_s=None,
                           accept_interruption=True)
    assert not isinstance(accepted, str) and accepted.how == "restart"
    idle = plan_change("p", runs_engines=True, serving=False, replicas=2, room=None, last_start_s=None,
                       accept_interruption=False)
    assert not isinstance(idle, str) and idle.how == "restart"
    remote = plan_change("p", runs_engines=False, serving=True, replicas=2, room=None, last_start_s=None,
                         accept_interruption=False)
    assert not isinstance(remote, str) and remote.how == "replace"


def test_room_is_judged_by_memory_on_a_cpu_host_and_by_free_gpus_on_a_gpu_host(tmp_path: Path) -> None:
    spec = EngineSpec(model="m", served_name="m", kv_cache_space_gib=2)
    (tmp_path / "weights.bin").write_bytes(b"\0" * 1024)
    cpu = Usage(memory_total=24 * GIB, memory_available=12 * GIB)  # 12 - 2.4 margin = 9.6 GiB spare
    room = judge_room(spec, tmp_path, cpu)
    assert room.fits == 2 and "4.0 GiB a replica" in room.how  # 2 KV + 2 engine (+1 KiB of weights)
    assert judge_room(spec, tmp_path, Usage(24 * GIB, 5 * GIB)).fits == 0
    gpu = EngineSpec(model="m", served_name="m", gpu_memory_utilization=0.5, tensor_parallel_size=2,
                     gpus_per_node=2)
    gpus = Usage(1, 1, (Gpu(80 * GIB, 79 * GIB), Gpu(80 * GIB, 41 * GIB), Gpu(80 * GIB, 10 * GIB)))
    assert judge_room(gpu, None, gpus).fits == 1  # two GPUs hold half of theirs free, the third does not


FLAGSHIP = {"model": "flagship", "messages": [{"role": "user", "content": "hi"}]}


def _remote_only(policy_file: Path, tmp_path: Path, watch_s: float) -> Settings:
    """A gateway that starts no engines, for the conftest policy's two remote pools."""
    return Settings(policy_path=policy_file, scorer="length", start_engines=False, ledger="memory", home=tmp_path,
                    admin_key=ADMIN, policy_watch_interval_s=watch_s)


def test_a_remote_pool_is_not_swapped_for_replicas_that_do_not_answer(
    policy_file: Path, tmp_path: Path, upstreams: tuple[object, str, object, str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("gateway.control.fleet.version_change.REPLACE_WAIT_S", 1.0)
    _, micro_url, _, flagship_url = upstreams
    with serve(create_app(_remote_only(policy_file, tmp_path, watch_s=0))) as url:
        before = httpx.get(url + "/readyz").json()["policy_version"]
        dead = f"http://127.0.0.1:{free_port()}"
        _edit(policy_file, f'urls: ["{flagship_url}"]', f'urls: ["{dead}"]')
        refused = httpx.post(url + "/admin/policy/reload", headers=AUTH, timeout=30)
        assert refused.status_code == 422
        assert "answered their health check within 1 s" in " ".join(refused.json()["error"]["problems"])
        assert httpx.get(url + "/readyz").json()["policy_version"] == before
        assert httpx.post(url + "/v1/chat/completions", json=FLAGSHIP, timeout=10).status_code == 200

        _edit(policy_file, f'urls: ["{dead}"]', f'urls: ["{micro_url}"]')  # another live server
        assert httpx.post(url + "/admin/policy/reload", headers=AUTH, timeout=30).status_code == 200
        r = httpx.post(url + "/v1/chat/completions", json=FLAGSHIP, timeout=10)
        assert r.status_code == 200 and r.headers["x-cascade-pool"] == "flagship"


def test_a_remote_pool_whose_new_servers_start_late_is_switched_by_the_watcher_once_they_answer(
    policy_file: Path, tmp_path: Path, upstreams: tuple[object, str, object, str], monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr("gateway.control.fleet.version_change.REPLACE_WAIT_S", 0.5)
    _, _, _, flagship_url = upstreams
    port = free_port()
    with (serve(create_app(_remote_only(policy_file, tmp_path, watch_s=0.2))) as url,
          caplog.at_level(logging.WARNING, logger="cascade.policy")):
        before = httpx.get(url + "/readyz").json()["policy_version"]
        _edit(policy_file, f'urls: ["{flagship_url}"]', f'urls: ["http://127.0.0.1:{port}"]')  # pods starting
        # the watcher tried (refused: nothing answers there yet) and will try again
        until(lambda: any("cannot be applied yet" in r.getMessage() for r in caplog.records), timeout=10)
        assert httpx.get(url + "/readyz").json()["policy_version"] == before
        assert httpx.post(url + "/v1/chat/completions", json=FLAGSHIP, timeout=10).status_code == 200
        with serve(FakeUpstream("flagship-model"), port=port):  # the new pods are up
            until(lambda: httpx.get(url + "/readyz").json()["policy_version"] != before, timeout=15)
            r = httpx.post(url + "/v1/chat/completions", json=FLAGSHIP, timeout=10)
            assert r.status_code == 200 and r.headers["x-cascade-pool"] == "flagship"


def test_a_remote_pool_that_becomes_local_starts_its_engines_before_it_switches(
    gateway: tuple[Path, str, Settings], upstreams: tuple[object, str, object, str],
) -> None:
    policy_file, _, settings = gateway
    app = create_app(settings)
    with serve(app) as url:
        until(lambda: _spare_ready(url))
        text = policy_file.read_text()
        start = text.index("  flagship:\n")
        end = text.index("\nrouting:")  # the flagship is the last pool
        local = f"""  flagship:
    type: local
    price: {{input_per_mtok: "3.00", output_per_mtok: "15.00"}}
    engine: {{model: fake-weights, served_name: flagship, base_port: {free_port()}, startup_timeout_s: 30}}"""
        policy_file.write_text(text[:start] + local + text[end:])
        assert httpx.post(url + "/admin/policy/reload", headers=AUTH, timeout=60).status_code == 200
        pool_set = app.state.runtime.pool_set
        (replica,) = pool_set.supervisors["flagship"].replicas
        assert [r.url for r in pool_set.pools["flagship"].replicas] == [replica.url]
        r = httpx.post(url + "/v1/chat/completions", json=FLAGSHIP, timeout=10)
        assert r.status_code == 200 and r.headers["x-cascade-pool"] == "flagship"
