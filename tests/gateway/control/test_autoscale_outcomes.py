"""Every autoscaler change ends in one scale event, whatever it raised; under `--workers N` the parent's events
and engine restarts reach every worker's `/metrics` through the shared metrics folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from backends.engines.room import NoRoom
from gateway.control.engine_host import EngineHost
from gateway.control.fleet.autoscale import Autoscaler
from gateway.control.fleet.pool_set import PoolSet
from gateway.settings import Settings
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.metrics_dir import MULTIPROC_ENV, worker_exited
from gateway.telemetry.worker_gauges import WorkerGauges, WorkerGaugesCollector
from tests.conftest import policy_yaml


class _RaisingPools:
    """A pool set whose every change raises `error` (a `PoolSet` stand-in: only what `Autoscaler.change` uses)."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    async def scale_up(self, name: str) -> int:
        raise self.error

    async def scale_down(self, name: str) -> int:
        raise self.error


@pytest.mark.parametrize(("error", "outcome"), [
    (KeyError("spare"), "failed"),  # the pool was removed by a reload between the tick and the change
    (RuntimeError("supervisor is stopping"), "failed"),
    (NoRoom("3 GiB free, 8 GiB needed"), "no_room"),
])
async def test_a_change_that_raises_is_reported_and_does_not_escape(error: BaseException, outcome: str) -> None:
    events: list[tuple[str, str, str]] = []
    scaler = Autoscaler(_RaisingPools(error), lambda now: {}, lambda *e: events.append(e))  # type: ignore[arg-type]
    await scaler.change("spare", "up", "kv_cache_usage averaged 0.9 > 0.8 over 10 s")
    assert events == [("spare", "up", outcome)]
    state = scaler.states["spare"]
    assert not state.busy and state.last and "0.9 > 0.8" in state.last


def _samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == name}


async def test_the_parents_scale_events_and_restarts_reach_the_workers_metrics(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml("http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1"))
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    host = EngineHost(Settings(policy_path=policy, home=tmp_path, scorer="none"), tmp_path / "registry",
                      metrics_dir, lambda spec, port, models: ["true"])

    async def no_room(self: PoolSet, name: str) -> int:
        raise NoRoom("no memory left")

    monkeypatch.setattr(PoolSet, "scale_up", no_room)
    await host.autoscaler.change("micro", "up", "queue_depth averaged 5 > 4 over 10 s")
    await host.autoscaler.change("micro", "up", "queue_depth averaged 6 > 4 over 10 s")
    assert host.pool_set.on_engine_restart is not None
    host.pool_set.on_engine_restart("micro", 0, "hung")
    monkeypatch.setenv(MULTIPROC_ENV, str(metrics_dir))  # what a worker's render reads: the shared folder
    text = GatewayMetrics(lambda: {}).render().decode()
    scale = _samples(text, "cascade_scale_events_total")
    assert scale == {(("direction", "up"), ("outcome", "no_room"), ("pool", "micro")): 2.0}
    restarts = _samples(text, "cascade_engine_restarts_total")
    assert restarts == {(("pool", "micro"), ("reason", "hung")): 1.0}
    await host.aclose()


def test_no_module_imports_a_private_prometheus_client_module() -> None:
    # prometheus_client's documented API is its top level, `core`, `registry`, `multiprocess` and `parser`;
    # `mmap_dict` and `values` are its internals and change between releases (the dependency is not pinned there)
    root = Path(__file__).resolve().parents[3]
    internal = ("prometheus_client.mmap_dict", "prometheus_client.values", "prometheus_client.metrics_core")
    sources = [p for d in ("gateway", "backends", "policies", "router_models") for p in (root / d).rglob("*.py")]
    assert len(sources) > 100
    offenders = [str(p.relative_to(root)) for p in sources if any(m in p.read_text() for m in internal)]
    assert offenders == []


def test_each_workers_own_gauges_are_published_with_its_label_and_leave_with_it(tmp_path: Path) -> None:
    class _Breaker:
        def collect(self) -> list[GaugeMetricFamily]:
            family = GaugeMetricFamily("cascade_replica_breaker_open", "open", labels=["pool", "replica"])
            family.add_metric(["micro", "http://a"], 1.0)
            return [family]

    WorkerGauges(tmp_path, [_Breaker()]).publish()
    (sample,) = [s for f in WorkerGaugesCollector(tmp_path).collect() for s in f.samples]
    assert sample.name == "cascade_replica_breaker_open" and sample.value == 1.0
    assert sample.labels == {"pool": "micro", "replica": "http://a", "worker": str(os.getpid())}
    worker_exited(os.getpid(), tmp_path)
    assert list(WorkerGaugesCollector(tmp_path).collect()) == []
