"""Scheduled retraining end to end: labels written the way the gateway writes them (the real Redis, each test's
own prefix), a real `cascade router train --from-ledger` in the niced child process (kept tiny: the fast static
embedder, --max-per-source 30), a promotion into the test's own artifact store, and a running gateway (uvicorn)
serving the new version through its store watcher, without a restart; a candidate that is not better is not
promoted and the gateway keeps its artifact. And a gateway's own lifespan runs the schedule.

The labels are made up from prompt length (the longer half needs the flagship) and the current artifact is built
here to rank by length alone, backwards or forwards: that makes each verdict certain (ranking the held-back labels
backwards loses to any sensible candidate; ranking them perfectly, with near-certain scores, cannot be beaten).
They judge nothing about quality.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest
import redis.asyncio as aioredis

from gateway.api.app import create_app
from gateway.learning.retrain import LedgerLabelIds, RetrainKeys, RetrainSchedule
from gateway.learning.store import LearningStore
from gateway.learning.train_process import TrainerProcess, TrainResult, train_command
from gateway.settings import Settings
from policies.learning import Retrain
from policies.loader import parse_policy
from router_models.embedders.features import FEATURE_NAMES, structural_features
from router_models.serving.artifact import RouterArtifact, save_artifact
from router_models.serving.artifact_store import ArtifactStore
from router_models.serving.classifier import LinearRouter
from router_models.serving.scorer import conversation_text
from router_models.training.outcomes import DEFAULT_ROUTING_DIR
from tests.conftest import delete_prefix, policy_yaml
from tests.servers import ROOT, free_port, serve, until

pytestmark = [
    pytest.mark.redis,
    pytest.mark.skipif(not DEFAULT_ROUTING_DIR.is_dir(),
                       reason=f"shared routing data not found at {DEFAULT_ROUTING_DIR} (set CASCADE_ROUTING_DATA)"),
]

EMBEDDER = "all-MiniLM-L6-v2:static"
STATIC_DIM = 384
LABELS = 60
RETRAIN = f"""learning:
  keep_prompts: {{sample: 1.0, ttl_days: 1}}
  retrain: {{every_hours: 24, min_new_labels: 40, held_back: 0.3, embedder: "{EMBEDDER}", timeout_minutes: 10}}
"""
# not the default database: the training child finds the ledger only through the URL the gateway hands it
LEDGER_URL = "redis://127.0.0.1:6379/12"
REPO_CACHE = ROOT / ".cascade" / "router-cache" / "static"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """$CASCADE_HOME of this test (its own artifact store) for this process and the training child; the static
    word-piece table is the repository's when it was built already (else built here once, about a minute)."""
    path = tmp_path / "home"
    (path / "router-cache").mkdir(parents=True)
    if REPO_CACHE.is_dir():
        (path / "router-cache" / "static").symlink_to(REPO_CACHE, target_is_directory=True)
    monkeypatch.setenv("CASCADE_HOME", str(path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("CASCADE_ROUTER_ARTIFACT", raising=False)
    return path


def _prompts() -> list[str]:
    lines = (ROOT / "loadtest" / "data" / "synthetic_prompts.jsonl").read_text().splitlines()
    return [conversation_text([{"role": "user", "content": json.loads(line)["prompt"]}])
            for line in lines[::5][:LABELS]]


def _log_chars(texts: list[str]) -> np.ndarray:
    return structural_features(texts)[:, FEATURE_NAMES.index("log_chars")].astype(np.float64)


def _length_artifact(home: Path, direction: float) -> str:
    """Promote an artifact that scores by prompt length alone (`direction` +1: longer is harder, -1: backwards),
    almost 0 or 1 away from the labels' median; returns its version."""
    lengths = _log_chars(_prompts())
    weights = np.zeros(STATIC_DIM + len(FEATURE_NAMES), np.float32)
    weights[STATIC_DIM + FEATURE_NAMES.index("log_chars")] = 40.0 * direction
    bias = -40.0 * direction * float(np.median(lengths))
    meta = {"feature_set": "embedding+structure", "target": "irt-fail", "created": f"2026-01-0{2 + int(direction)}"}
    seed = save_artifact(RouterArtifact(LinearRouter(weights, bias), EMBEDDER, meta), home.parent / "seed" / "a.json")
    return ArtifactStore(home / "router").promote(seed).version


async def _write_labels(prefix: str) -> None:
    """One kept prompt and one thumb per request, through the gateway's own writer (`LearningStore`): the longer
    half thumbed down (the micro answer fell short), the rest up."""
    texts = _prompts()
    median = float(np.median(_log_chars(texts)))
    client = aioredis.Redis.from_url(LEDGER_URL)
    store = LearningStore(client, prefix)
    try:
        for i, (text, length) in enumerate(zip(texts, _log_chars(texts), strict=True)):
            request_id, short = f"req_{i:03d}", length > median
            at = str(int(time.time()))
            await store.put(store.labels.prompt(request_id), {"text": text, "score": "0.5", "pool": "micro",
                                                              "micro": "1", "tenant": "t", "at": at}, 3600)
            await store.put(store.labels.feedback(request_id), {"score": "0.0" if short else "1.0", "thumbs":
                                                                "down" if short else "up", "comment": "",
                                                                "tenant": "t", "at": at}, 3600)
    finally:
        await client.aclose()


@pytest.fixture
def ledger(prefix: str) -> Iterator[str]:
    """This test's prefix in the ledger's database, emptied afterwards."""
    yield prefix
    delete_prefix(prefix, LEDGER_URL)


@contextmanager
def _gateway(home: Path, prefix: str) -> Iterator[tuple[str, Settings]]:
    """A gateway serving the store (its own schedule off: the test takes the look itself), watching it 5x a
    second."""
    policy = home / "policy.yaml"
    policy.write_text(policy_yaml("http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1"))
    settings = Settings(policy_path=policy, redis_url=LEDGER_URL, redis_prefix=prefix, scorer="classifier",
                        start_engines=False, ledger="redis", home=home, policy_watch_interval_s=0.2,
                        router_artifact=None, router_overflow="none")
    with serve(create_app(settings)) as url:
        yield url, settings


def _serving(url: str) -> str:
    return str(httpx.get(url + "/readyz", timeout=10).json()["router_version"])


async def _look(settings: Settings, home: Path) -> TrainResult | None:
    """One look of the schedule, with the real child process (made tiny by --max-per-source)."""
    loaded = parse_policy(policy_yaml("http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1", RETRAIN), "policy.yaml")

    def tiny(retrain: Retrain, prefix: str) -> list[str]:
        return [*train_command(retrain, prefix), "--max-per-source", "30"]

    client = aioredis.Redis.from_url(LEDGER_URL)
    trainer = TrainerProcess(LEDGER_URL, settings.redis_prefix, tiny)
    labels = LedgerLabelIds(LEDGER_URL, settings.redis_prefix)
    schedule = RetrainSchedule(settings, lambda: loaded, client, trainer, labels,
                               RetrainKeys(settings.redis_prefix, str(home / "router")))
    try:
        return await asyncio.wait_for(schedule.tick(), 300)
    finally:
        await client.aclose()


async def test_a_better_candidate_is_promoted_and_the_running_gateway_serves_it_without_a_restart(
        home: Path, ledger: str) -> None:
    backwards = _length_artifact(home, -1.0)
    await _write_labels(ledger)
    with _gateway(home, ledger) as (url, settings):
        assert _serving(url) == backwards
        result = await _look(settings, home)
        assert result is not None and result.outcome == "promoted", result
        assert result.apgr_delta is not None and result.apgr_delta > 0
        assert result.detail.startswith("candidate APGR") and "held-back labels of your traffic" in result.detail
        history = [e.version for e in ArtifactStore(home / "router").history()]
        assert history[:-1] == [backwards] and result.version == history[-1]
        until(lambda: _serving(url) == result.version, 30)  # swapped in by the gateway's store watcher

@pytest.mark.slow
async def test_a_candidate_that_is_not_better_is_not_promoted_and_the_gateway_keeps_its_artifact(
        home: Path, ledger: str) -> None:
    perfect = _length_artifact(home, 1.0)
    await _write_labels(ledger)
    with _gateway(home, ledger) as (url, settings):
        assert _serving(url) == perfect
        result = await _look(settings, home)
        assert result is not None and result.outcome == "not_better", result
        assert result.apgr_delta is not None and result.apgr_delta <= 0
        assert result.detail.startswith("candidate APGR")
        assert [e.version for e in ArtifactStore(home / "router").history()] == [perfect]
        time.sleep(1.0)  # five looks of the watcher: nothing changed
        assert _serving(url) == perfect


def test_the_gateway_runs_the_schedule_and_counts_its_looks(home: Path, ledger: str) -> None:
    policy = home / "policy.yaml"
    policy.write_text(policy_yaml("http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1", RETRAIN))
    _length_artifact(home, 1.0)
    settings = Settings(policy_path=policy, redis_url=LEDGER_URL, redis_prefix=ledger, scorer="classifier",
                        start_engines=False, ledger="redis", home=home, policy_watch_interval_s=0,
                        router_overflow="none")
    with serve(create_app(settings)) as url:
        def counted() -> bool:
            return 'cascade_router_retrain_runs_total{outcome="skipped"} 1.0' in httpx.get(url + "/metrics").text

        until(counted, 30)  # the first look comes at start: no labels, skipped
        body = httpx.get(url + "/metrics").text
        stamp = re.search(r"^cascade_router_retrain_last_run_timestamp_seconds (\S+)$", body, re.MULTILINE)
        assert stamp is not None and abs(float(stamp[1]) - time.time()) < 60


@pytest.mark.slow
def test_of_several_workers_one_takes_the_look(home: Path, ledger: str, tmp_path: Path) -> None:
    """`cascade serve --workers 3`: each worker runs the schedule and looks at start; one look is taken (summed
    over the workers in /metrics), the others find it recorded."""
    policy = home / "policy.yaml"
    policy.write_text(policy_yaml("http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1", RETRAIN))
    _length_artifact(home, 1.0)
    port = free_port()
    cmd = [sys.executable, "-m", "gateway", "serve", "--workers", "3", "--policy", str(policy), "--port", str(port),
           "--scorer", "classifier", "--router-overflow", "none", "--no-engines", "--redis-url", LEDGER_URL,
           "--redis-prefix", ledger, "--log-level", "INFO"]
    log_path = tmp_path / "gateway.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "CASCADE_HOME": str(home)}, stdout=log,
                                stderr=subprocess.STDOUT)
    try:
        def looked_at_by_all() -> bool:
            text = log_path.read_text()
            assert proc.poll() is None, text[-3000:]
            return text.count("gateway up") == 3

        until(looked_at_by_all, 120)
        time.sleep(1.0)  # each worker's first look runs just after its start
        body = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        assert 'cascade_router_retrain_runs_total{outcome="skipped"} 1.0' in body, log_path.read_text()[-3000:]
        assert log_path.read_text().count("retrain: skipped: 0 labelled requests") == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
