"""Replicas that follow load: the decision (sustained pressure, cool-down, bounds, idle), the policy checks, and a
pool that grows to two replicas under load and shrinks back when idle with no request lost, engines being fake
upstreams run as real processes by the real supervisor (as in `test_pool_change.py`). The same on real vLLM
engines, against a fixed single replica in one run, is `loadtest/scenarios/autoscale.py` (BENCHMARKS.md)."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path

import httpx
import pytest

from backends.engines.room import Room
from backends.engines.supervisor import EngineSupervisor
from gateway.api.app import create_app
from gateway.control.fleet.autoscale import ScaleState, decide, pressure
from gateway.settings import Settings
from policies.autoscale import Autoscale, ScaleUp
from policies.loader import PolicyError, load_policy
from tests.servers import alive, fake_engine, free_port, serve, until

SCALE = Autoscale(min_replicas=1, max_replicas=3, scale_up=ScaleUp(kv_cache_usage=0.8, sustained_s=10),
                  scale_down_after_idle_s=60, cooldown_s=30)


def test_growth_needs_the_mean_over_the_window_above_the_bound() -> None:
    state = ScaleState()

    def tick(t: float, kv: float | None) -> str | None:
        return pressure(SCALE, state, t, {} if kv is None else {("kv_cache_usage", "p"): kv}, "p")

    assert tick(100.0, 0.9) is None  # less than sustained_s (10 s) of samples yet
    assert tick(105.0, 0.2) is None
    assert tick(110.0, 0.5) is None  # the mean of 0.9, 0.2 and 0.5 is under the bound
    state = ScaleState()
    readings = [0.9, 0.95, 0.5, 0.9, 0.95, 0.9, 0.95, 0.9, 0.95, 0.9, 0.95]  # a dip does not reset it
    verdicts = [tick(200.0 + i, kv) for i, kv in enumerate(readings)]
    assert verdicts[:-1] == [None] * 10 and verdicts[-1] == "kv_cache_usage averaged 0.886 > 0.8 over 10 s"
    calm = ScaleState()
    for i in range(12):
        quiet = pressure(SCALE, calm, float(i), {("kv_cache_usage", "p"): 0.9 if i % 2 else 0.5}, "p")
    assert quiet is None  # a mean of 0.7: under the bound
    assert pressure(SCALE, ScaleState(), 0.0, {}, "p") is None  # no signal is no pressure


def test_growth_respects_the_bounds_and_the_cooldown() -> None:
    over = "kv_cache_usage averaged 0.9 > 0.8 over 10 s"
    assert decide(SCALE, 1, ScaleState(), 100.0, over, idle=False) == ("up", over)
    assert decide(SCALE, 3, ScaleState(), 100.0, over, idle=False) is None  # at max_replicas
    assert decide(SCALE, 1, ScaleState(changed_at=80.0), 100.0, over, idle=False) is None  # cooling down (30 s)
    assert decide(SCALE, 1, ScaleState(changed_at=69.0), 100.0, over, idle=False) is not None
    assert decide(SCALE, 1, ScaleState(busy=True), 100.0, over, idle=False) is None  # a change under way


def test_shrinking_needs_idleness_for_the_window_and_stops_at_min() -> None:
    state = ScaleState()
    assert decide(SCALE, 2, state, 0.0, None, idle=True) is None
    assert decide(SCALE, 2, state, 59.0, None, idle=True) is None
    assert decide(SCALE, 2, state, 60.0, None, idle=True) == ("down", "idle for 60 s")
    assert decide(SCALE, 1, ScaleState(idle_since=0.0), 600.0, None, idle=True) is None  # at min_replicas
    busy = ScaleState(idle_since=0.0, busy=True)
    assert decide(SCALE, 2, busy, 600.0, None, idle=True) is None  # a change is under way


@pytest.mark.parametrize(("block", "expected"), [
    ("autoscale: {min_replicas: 3, max_replicas: 2, scale_up: {kv_cache_usage: 0.8}}", "min_replicas 3 > "),
    ("autoscale: {max_replicas: 2, scale_up: {kv_cache_use: 0.8}}", "kv_cache_use"),
    ("autoscale: {max_replicas: 2, scale_up: {sustained_s: 5}}", "at least one of"),
    ("autoscale: {min_replicas: 2, max_replicas: 3, scale_up: {queue_depth: 4}}", "outside autoscale's [2, 3]"),
    ("autoscale: {max_replicas: 2, scale_up: {queue_depth: -1}}", "greater than 0"),
])
def test_a_bad_autoscale_block_is_refused_with_its_line(tmp_path: Path, block: str, expected: str) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(_policy(block))
    with pytest.raises(PolicyError) as err:
        load_policy(path)
    assert expected in str(err.value) and f"{path}:" in str(err.value)


def test_the_pool_must_grow_before_the_ladder_sheds(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    ladder = """degradation:
  steps:
    - {name: shed-micro, signal: queue_depth, pool: spare, enter_above: 4, exit_below: 1,
       action: {type: shed, below_priority: 1}}
"""
    path.write_text(_policy("autoscale: {max_replicas: 2, scale_up: {queue_depth: 4}}", ladder))
    with pytest.raises(PolicyError) as err:
        load_policy(path)
    assert "shed-micro" in str(err.value) and "before it grows" in str(err.value)
    path.write_text(_policy("autoscale: {max_replicas: 2, scale_up: {queue_depth: 2}}", ladder))
    assert load_policy(path).policy.pools["spare"].autoscale is not None  # type: ignore[union-attr]


def _policy(block: str, extra: str = "") -> str:
    return f"""version: 1
pools:
  spare:
    type: local
    price: {{input_per_mtok: "0.10", output_per_mtok: "0.10"}}
    engine: {{model: fake-weights, served_name: spare-model, base_port: {free_port()}, startup_timeout_s: 30}}
    {block}
  flagship:
    type: remote
    urls: ["http://127.0.0.1:9"]
    model: flagship
    price: {{input_per_mtok: "3.00", output_per_mtok: "15.00"}}
routing: {{micro_pool: spare, flagship_pool: flagship}}
{extra}"""


@pytest.fixture
def gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    supervisor = functools.partial(EngineSupervisor, command=fake_engine, check_interval_s=0.2, stop_grace_s=5)
    monkeypatch.setattr("gateway.control.fleet.pool_set.EngineSupervisor", supervisor)
    path = tmp_path / "policy.yaml"
    path.write_text(_policy("autoscale: {max_replicas: 2, scale_up: {in_flight: 2, sustained_s: 0.5}, "
                            "scale_down_after_idle_s: 1.5, cooldown_s: 0.5}"))
    return Settings(policy_path=path, scorer="length", start_engines=True, ledger="memory", home=tmp_path,
                    policy_watch_interval_s=0, probe_interval_s=0.2)


def _replicas(url: str) -> dict[str, object]:
    return httpx.get(url + "/readyz").json()["autoscale"]["spare"]  # type: ignore[no-any-return]


async def test_a_pool_grows_under_load_and_shrinks_when_idle_losing_no_request(gateway: Settings) -> None:
    app = create_app(gateway)
    with serve(app) as url:
        pool_set = app.state.runtime.pool_set
        await asyncio.to_thread(until, lambda: httpx.get(url + "/readyz").json()["pools"].get("spare") is True)
        async with httpx.AsyncClient(timeout=30) as client:
            done = asyncio.Event()

            async def traffic(worker: int) -> list[str]:
                outcomes = []
                body = {"model": "spare", "messages": [{"role": "user", "content": "hi"}], "stream": worker % 2 == 0,
                        "metadata": {"fake_tokens": "10", "fake_delay_ms": "30"}}  # ~0.3 s a request
                while not done.is_set():
                    r = await client.post(url + "/v1/chat/completions", json=body)
                    ok = r.status_code == 200 and (not body["stream"] or r.text.rstrip().endswith("data: [DONE]"))
                    outcomes.append("ok" if ok else f"{r.status_code} {r.text[:200]}")
                return outcomes

            async def watch() -> list[int]:
                try:
                    await asyncio.to_thread(until, lambda: len(pool_set.pools["spare"].replicas) == 2, 30)
                    await asyncio.to_thread(until, lambda: all(r.in_flight for r in pool_set.pools["spare"].replicas),
                                            10)  # both replicas serve
                    return [r.in_flight for r in pool_set.pools["spare"].replicas]
                finally:
                    done.set()

            results, _ = await asyncio.gather(asyncio.gather(*(traffic(w) for w in range(6))), watch())
        assert [o for worker in results for o in worker if o != "ok"] == []
        sup = pool_set.supervisors["spare"]
        added = max(sup.replicas, key=lambda r: r.index)
        assert added.index == 1 and added.pid is not None
        assert "added a replica (in_flight" in str(_replicas(url)["last"])
        await asyncio.to_thread(until, lambda: len(pool_set.pools["spare"].replicas) == 1, 30)  # idle: back to 1
        await asyncio.to_thread(until, lambda: not alive(added.pid), 20)  # drained, then stopped
        status = _replicas(url)
        assert status["replicas"] == 1 and "removed a replica (idle" in str(status["last"])
        metrics = httpx.get(url + "/metrics").text
        assert 'cascade_scale_events_total{direction="up",outcome="done",pool="spare"} 1.0' in metrics
        assert 'cascade_scale_events_total{direction="down",outcome="done",pool="spare"} 1.0' in metrics
        assert 'cascade_pool_replicas{pool="spare"} 1.0' in metrics


async def test_a_pool_with_no_room_does_not_grow_and_says_why(gateway: Settings,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gateway.control.fleet.replica_scaling.judge_room",
                        lambda spec, model_dir: Room(0, "memory: full"))
    app = create_app(gateway)
    with serve(app) as url:
        await asyncio.to_thread(until, lambda: httpx.get(url + "/readyz").json()["pools"].get("spare") is True)
        async with httpx.AsyncClient(timeout=30) as client:
            body = {"model": "spare", "messages": [{"role": "user", "content": "hi"}],
                    "metadata": {"fake_tokens": "20", "fake_delay_ms": "50"}}  # ~1 s each, 4 at once
            replies = await asyncio.gather(*(client.post(url + "/v1/chat/completions", json=body)
                                             for _ in range(4)))
        assert [r.status_code for r in replies] == [200] * 4
        await asyncio.to_thread(until, lambda: "cannot grow" in str(_replicas(url)["last"]), 10)
        assert "memory: full" in str(_replicas(url)["last"]) and _replicas(url)["replicas"] == 1
        metrics = httpx.get(url + "/metrics").text
        assert 'cascade_scale_events_total{direction="up",outcome="no_room",pool="spare"}' in metrics
