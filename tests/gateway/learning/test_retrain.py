"""The retraining schedule: when a look is due (a fake clock), what it counts, when it trains (a fake trainer),
what it remembers, that one process of several takes each look, and that a gateway not serving the store never
retrains. State and lock live in the real Redis under each test's own prefix."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from gateway.learning.retrain import RetrainKeys, RetrainSchedule, store_problem
from gateway.learning.train_process import TrainResult
from gateway.settings import Settings
from policies.learning import Retrain
from policies.loader import LoadedPolicy, parse_policy
from tests.conftest import SHARED_URL, policy_yaml

pytestmark = pytest.mark.redis

HOUR = 3600.0
RETRAIN = "learning:\n  keep_prompts: {sample: 1}\n  retrain:\n    every_hours: 24\n    min_new_labels: 10\n"


def _policy(extra: str = RETRAIN) -> LoadedPolicy:
    return parse_policy(policy_yaml("http://127.0.0.1:1", "http://127.0.0.1:2", extra), "policy.yaml")


@dataclass
class FakeTrainer:
    """Answers each run with the next of `results` (the last one repeats) after `delay_s`."""

    results: list[TrainResult]
    delay_s: float = 0.0
    runs: list[Retrain] = field(default_factory=list)

    async def run(self, retrain: Retrain) -> TrainResult:
        self.runs.append(retrain)
        await asyncio.sleep(self.delay_s)
        return self.results[min(len(self.runs), len(self.results)) - 1]


@dataclass
class FakeLabels:
    ids: set[str]

    async def label_ids(self) -> set[str]:
        return set(self.ids)


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Rig:
    schedule: RetrainSchedule
    trainer: FakeTrainer
    labels: FakeLabels
    clock: Clock
    seen: list[tuple[str, float]]
    swaps: list[int]


PROMOTED = TrainResult("promoted", "candidate APGR 0.61 vs current 0.52 (+0.0900) on 30 held-back labels", "v2", 0.09)
NOT_BETTER = TrainResult("not_better", "candidate APGR 0.50 vs current 0.52 (-0.0200) on 30 ...", None, -0.02)
FAILED = TrainResult("failed", "the training exited with 2: error: boom")


@pytest.fixture
async def redis_client() -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(SHARED_URL)
    yield client
    await client.aclose()


def _rig(prefix: str, tmp_path: Path, redis: aioredis.Redis, results: list[TrainResult], *,
         policy: LoadedPolicy | None = None, settings: Settings | None = None, delay_s: float = 0.0,
         clock: Clock | None = None) -> Rig:
    loaded = policy or _policy()
    settings = settings or Settings(policy_path=tmp_path / "policy.yaml", redis_prefix=prefix, ledger="redis",
                                    scorer="classifier", router_artifact=None)
    trainer, labels, clock = FakeTrainer(results, delay_s), FakeLabels(set()), clock or Clock()
    seen: list[tuple[str, float]] = []
    swaps: list[int] = []

    async def swap() -> None:
        swaps.append(1)

    schedule = RetrainSchedule(settings, lambda: loaded, redis, trainer, labels,
                               RetrainKeys(prefix, str(tmp_path / "store"), host="test-host"),
                               on_result=lambda result, at: seen.append((result.outcome, at)), swap=swap,
                               clock=clock)
    return Rig(schedule, trainer, labels, clock, seen, swaps)


@pytest.fixture(autouse=True)
def _no_pinned_artifact(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CASCADE_ROUTER_ARTIFACT", raising=False)


async def test_the_first_look_comes_at_once_and_the_next_every_hours_later(
        prefix: str, tmp_path: Path, redis_client: aioredis.Redis) -> None:
    rig = _rig(prefix, tmp_path, redis_client, [PROMOTED])
    rig.labels.ids = {f"r{i}" for i in range(4)}
    first = await rig.schedule.tick()
    assert first is not None and first.outcome == "skipped"
    assert first.detail == ("4 labelled requests are new since the last training (4 in the ledger), fewer than "
                            "min_new_labels 10")
    assert rig.trainer.runs == [] and rig.seen == [("skipped", rig.clock.now)]
    rig.labels.ids = {f"r{i}" for i in range(40)}
    rig.clock.now += 23.9 * HOUR
    assert await rig.schedule.tick() is None  # not due yet, however many labels came meanwhile
    rig.clock.now += 0.1 * HOUR
    due = await rig.schedule.tick()
    assert due is not None and due.outcome == "promoted" and len(rig.trainer.runs) == 1
    assert rig.trainer.runs[0].min_new_labels == 10 and rig.swaps == [1]
    state = await redis_client.hgetall(RetrainKeys(prefix, str(tmp_path / "store"), host="test-host").state)
    assert state[b"outcome"] == b"promoted" and state[b"version"] == b"v2" and state[b"new"] == b"40"
    assert float(state[b"at"]) == rig.clock.now


async def test_labels_seen_by_a_finished_training_are_not_new_and_a_failed_one_trains_again(
        prefix: str, tmp_path: Path, redis_client: aioredis.Redis) -> None:
    rig = _rig(prefix, tmp_path, redis_client, [NOT_BETTER, FAILED, PROMOTED])
    rig.labels.ids = {f"r{i}" for i in range(12)}
    assert (await rig.schedule.tick()).outcome == "not_better"  # type: ignore[union-attr]
    rig.labels.ids |= {"r12", "r13"}
    rig.clock.now += 24 * HOUR
    skipped = await rig.schedule.tick()
    assert skipped is not None and skipped.outcome == "skipped" and skipped.detail.startswith("2 labelled requests")
    rig.labels.ids |= {f"n{i}" for i in range(10)}
    rig.clock.now += 24 * HOUR
    assert (await rig.schedule.tick()).outcome == "failed"  # type: ignore[union-attr]
    rig.clock.now += 24 * HOUR
    again = await rig.schedule.tick()  # the failed run saw nothing: the same 12 are still new
    assert again is not None and again.outcome == "promoted" and len(rig.trainer.runs) == 3
    assert [outcome for outcome, _ in rig.seen] == ["not_better", "skipped", "failed", "promoted"]
    assert rig.swaps == [1]  # swapped in after the promotion only


async def test_of_several_processes_on_one_store_exactly_one_takes_each_look(
        prefix: str, tmp_path: Path, redis_client: aioredis.Redis) -> None:
    clock = Clock()
    rigs = [_rig(prefix, tmp_path, redis_client, [PROMOTED], delay_s=0.3, clock=clock) for _ in range(4)]
    for rig in rigs:
        rig.labels.ids = {f"r{i}" for i in range(50)}
    results = await asyncio.gather(*(rig.schedule.tick() for rig in rigs))
    assert sum(r is not None for r in results) == 1
    assert sum(len(rig.trainer.runs) for rig in rigs) == 1
    clock.now += 1 * HOUR  # a process whose look comes later finds the time recorded: not due
    assert await asyncio.gather(*(rig.schedule.tick() for rig in rigs)) == [None] * 4
    other_store = _rig(prefix, tmp_path / "other", redis_client, [PROMOTED], clock=clock)
    other_store.labels.ids = {f"r{i}" for i in range(50)}
    assert (await other_store.schedule.tick()) is not None  # another store (host) retrains its own


async def test_a_look_waits_for_the_lock_of_a_process_that_trains(
        prefix: str, tmp_path: Path, redis_client: aioredis.Redis) -> None:
    rig = _rig(prefix, tmp_path, redis_client, [PROMOTED])
    rig.labels.ids = {f"r{i}" for i in range(50)}
    keys = RetrainKeys(prefix, str(tmp_path / "store"), host="test-host")
    await redis_client.set(keys.lock, "someone-else", px=500)
    assert await rig.schedule.tick() is None and rig.trainer.runs == []
    assert await redis_client.get(keys.lock) == b"someone-else"  # not released by a process that does not own it
    await asyncio.sleep(0.6)  # the holder died: its lock expires
    assert (await rig.schedule.tick()) is not None and await redis_client.get(keys.lock) is None


async def test_off_does_nothing(prefix: str, tmp_path: Path, redis_client: aioredis.Redis) -> None:
    rig = _rig(prefix, tmp_path, redis_client, [PROMOTED], policy=_policy(""))
    rig.labels.ids = {f"r{i}" for i in range(50)}
    assert await rig.schedule.tick() is None
    assert await redis_client.keys(f"{prefix}*") == []


@pytest.mark.parametrize("change, says", [
    ({"router_artifact": Path("/srv/pinned.json")}, "this gateway serves /srv/pinned.json (--router-artifact or "
                                                    "$CASCADE_ROUTER_ARTIFACT), not the artifact store"),
    ({"scorer": "length"}, "this gateway runs --scorer length: no trained router to retrain"),
    ({"ledger": "memory"}, "this gateway runs with --ledger memory"),
])
async def test_a_gateway_that_does_not_serve_the_store_warns_once_with_the_policy_line_and_never_trains(
        prefix: str, tmp_path: Path, redis_client: aioredis.Redis, caplog: pytest.LogCaptureFixture,
        change: dict[str, object], says: str) -> None:
    settings = Settings(policy_path=tmp_path / "policy.yaml", redis_prefix=prefix, **change)  # type: ignore[arg-type]
    assert store_problem(settings) is not None and says in str(store_problem(settings))
    rig = _rig(prefix, tmp_path, redis_client, [PROMOTED], settings=settings)
    rig.labels.ids = {f"r{i}" for i in range(50)}
    loaded = _policy()
    line = loaded.text.splitlines().index("    every_hours: 24") + 1
    with caplog.at_level(logging.WARNING, logger="cascade.retrain"):
        for _ in range(3):
            assert await rig.schedule.tick() is None
            rig.clock.now += 48 * HOUR
    warnings = [r.getMessage() for r in caplog.records if r.name == "cascade.retrain"]
    assert len(warnings) == 1
    assert warnings[0].startswith(f"retrain: policy.yaml:{line}: learning.retrain.every_hours: retraining is on but "
                                  f"does not run here: {says}")
    assert rig.trainer.runs == [] and await redis_client.keys(f"{prefix}*") == []


async def test_the_environment_pin_counts_as_not_serving_the_store(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    settings = Settings(policy_path=tmp_path / "policy.yaml")
    assert store_problem(settings) is None
    monkeypatch.setenv("CASCADE_ROUTER_ARTIFACT", "/srv/env-pinned.json")
    assert "this gateway serves /srv/env-pinned.json" in str(store_problem(settings))


async def test_retraining_on_a_redis_cluster_ledger_is_refused_at_load_with_the_policy_line(tmp_path: Path) -> None:
    from gateway.api.runtime import build_runtime
    from gateway.learning.retrain import check_retrain
    from policies.loader import PolicyError

    path = tmp_path / "policy.yaml"
    path.write_text(_policy().text)
    line = _policy().text.splitlines().index("    every_hours: 24") + 1
    cluster = Settings(policy_path=path, scorer="none", start_engines=False, ledger="redis", home=tmp_path,
                       redis_url="redis+cluster://127.0.0.1:1")
    with pytest.raises(PolicyError) as err:
        await build_runtime(cluster)  # refused before anything connects
    assert f"policy.yaml:{line}: learning.retrain.every_hours: retraining reads its labels from one Redis" in str(
        err.value)
    assert "Redis Cluster (redis+cluster://)" in str(err.value)
    check_retrain(_policy(""), cluster)  # retraining off: nothing to refuse
    check_retrain(_policy(), Settings(policy_path=path, redis_url="redis://127.0.0.1:1"))  # one Redis: fine
