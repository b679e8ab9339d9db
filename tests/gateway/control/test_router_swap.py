"""Hot router swaps with the real trained scorer: a promotion into the store (what `cascade router train`
does) and a rollback are served under traffic without a restart and without a failed request, each answer and
cost record naming the artifact that scored it; `POST /admin/router/reload` refuses a corrupt artifact and one
whose scores are not probabilities, and the running router keeps serving."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from gateway.api.app import create_app
from gateway.ledger.store import MemoryLedger
from gateway.settings import Settings
from router_models.serving.artifact import (
    DEFAULT_ARTIFACT,
    RouterArtifact,
    artifact_version,
    load_artifact,
    save_artifact,
)
from router_models.serving.artifact_store import ArtifactStore
from router_models.serving.classifier import LinearRouter
from router_models.serving.scorer import ConversationShape
from tests.conftest import cascade_home
from tests.servers import serve

ADMIN = "router-swap-admin-key"
AUTH = {"authorization": f"Bearer {ADMIN}"}
SHIPPED = artifact_version(DEFAULT_ARTIFACT, load_artifact(DEFAULT_ARTIFACT).metadata)


def _ask(url: str, text: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", timeout=30,
                      json={"model": "auto", "messages": [{"role": "user", "content": text}]})


def _settings(policy_file: Path, tmp_path: Path, **more: object) -> Settings:
    return Settings(policy_path=policy_file, scorer="classifier", start_engines=False, ledger="memory",
                    admin_key=ADMIN, home=tmp_path, **more)  # type: ignore[arg-type]


@pytest.mark.slow
async def test_a_promotion_and_a_rollback_swap_the_router_under_traffic(
    policy_file: Path, tmp_path: Path, upstreams: tuple[object, str, object, str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CASCADE_HOME", str(cascade_home(tmp_path)))  # an empty store: the shipped artifact serves
    app = create_app(_settings(policy_file, tmp_path, policy_watch_interval_s=0.1))
    store = ArtifactStore(tmp_path / "router")
    with serve(app) as url:
        assert httpx.get(url + "/readyz").json()["router_version"] == SHIPPED
        async with httpx.AsyncClient(timeout=30) as client:
            done = asyncio.Event()
            seen: list[tuple[int, str]] = []

            async def traffic(worker: int) -> None:
                n = 0
                while not done.is_set():
                    n += 1
                    r = await client.post(url + "/v1/chat/completions", json={"model": "auto", "messages": [
                        {"role": "user", "content": f"client {worker} asks question {n}"}]})
                    seen.append((r.status_code, r.headers.get("x-cascade-router-version", "")))

            async def until_served(version: str) -> None:
                deadline = time.monotonic() + 60
                while not seen or seen[-1][1] != version:
                    assert time.monotonic() < deadline, f"{version} never served: {seen[-3:]}"
                    await asyncio.sleep(0.1)

            async def change() -> str:
                try:
                    await asyncio.sleep(0.5)
                    entry = await asyncio.to_thread(store.promote, DEFAULT_ARTIFACT)
                    await until_served(entry.version)
                    await asyncio.to_thread(store.rollback)
                    await until_served(SHIPPED)
                    return entry.version
                finally:
                    done.set()

            *_, promoted = await asyncio.gather(traffic(0), traffic(1), change())
        assert [s for s in seen if s[0] != 200] == []
        versions = [v for _, v in seen]
        assert versions[0] == SHIPPED and promoted in versions and versions[-1] == SHIPPED
        ledger = app.state.runtime.ledger
        assert isinstance(ledger, MemoryLedger)
        assert {r.router_version for r in ledger.records.values()} == {SHIPPED, promoted}
        assert httpx.get(url + "/readyz").json()["router_version"] == SHIPPED


def _copy(to: Path) -> Path:
    target = to / DEFAULT_ARTIFACT.name
    shutil.copy(DEFAULT_ARTIFACT, target)
    shutil.copy(DEFAULT_ARTIFACT.with_suffix(".npz"), target.with_suffix(".npz"))
    return target


def test_a_bad_artifact_is_refused_and_the_running_router_keeps_serving(
    policy_file: Path, tmp_path: Path, upstreams: tuple[object, str, object, str],
) -> None:
    named = _copy(tmp_path)
    app = create_app(_settings(policy_file, tmp_path, policy_watch_interval_s=0, router_artifact=named))
    with serve(app) as url:
        before = _ask(url, "hello").headers["x-cascade-router-version"]
        assert before == f"complexity-router@{SHIPPED.split('@')[1]}"

        named.with_suffix(".npz").write_bytes(b"not an artifact")  # corrupt on disk
        refused = httpx.post(url + "/admin/router/reload", headers=AUTH, timeout=60)
        assert refused.status_code == 422 and refused.json()["error"]["code"] == "invalid_router_artifact"
        assert "the running router stays" in refused.json()["error"]["message"]
        reply = _ask(url, "hello again")
        assert reply.status_code == 200 and reply.headers["x-cascade-router-version"] == before

        art = load_artifact(DEFAULT_ARTIFACT)
        nan = LinearRouter(np.full_like(art.router.weights, np.nan), float("nan"))
        save_artifact(RouterArtifact(nan, art.embedder, dict(art.metadata)), named)  # hash-true, NaN weights
        refused = httpx.post(url + "/admin/router/reload", headers=AUTH, timeout=60)
        assert refused.status_code == 422 and "bad weights" in refused.json()["error"]["message"]
        assert _ask(url, "and again").headers["x-cascade-router-version"] == before

        _copy(tmp_path)  # the good one back: a reload of the same version changes nothing
        same = httpx.post(url + "/admin/router/reload", headers=AUTH, timeout=60)
        assert same.status_code == 200 and same.json() == {"router_version": before, "changed": False}
        assert httpx.post(url + "/admin/router/reload", timeout=10).status_code == 401


class _NotProbabilities:
    version = "broken@0"

    def __init__(self) -> None:
        self.closed = False

    async def score(self, texts: list[str]) -> list[float]:
        return [float("nan")] + [2.0] * (len(texts) - 1)

    async def score_one(self, text: str, shape: ConversationShape | None = None) -> tuple[float, str]:
        return float("nan"), "primary"

    async def aclose(self) -> None:
        self.closed = True


def test_a_scorer_whose_probe_scores_are_not_probabilities_is_refused(
    policy_file: Path, tmp_path: Path, upstreams: tuple[object, str, object, str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = create_app(_settings(policy_file, tmp_path, policy_watch_interval_s=0))
    broken = _NotProbabilities()
    with serve(app) as url:
        before = _ask(url, "hello").headers["x-cascade-router-version"]
        monkeypatch.setattr("gateway.serving.routing.router_swap.make_scorer", lambda settings: broken)
        refused = httpx.post(url + "/admin/router/reload", headers=AUTH, timeout=60)
        assert refused.status_code == 422 and "not a probability per text" in refused.json()["error"]["message"]
        assert broken.closed and _ask(url, "again").headers["x-cascade-router-version"] == before


def test_a_gateway_without_a_trained_router_says_there_is_nothing_to_reload(policy_file: Path,
                                                                             tmp_path: Path) -> None:
    settings = Settings(policy_path=policy_file, scorer="length", start_engines=False, ledger="memory",
                        admin_key=ADMIN, home=tmp_path, policy_watch_interval_s=0)
    with serve(create_app(settings)) as url:
        r = httpx.post(url + "/admin/router/reload", headers=AUTH, timeout=10)
        assert r.status_code == 422 and r.json()["error"]["code"] == "no_router_artifact"
        assert "--scorer length" in r.json()["error"]["message"]
