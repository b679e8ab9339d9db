"""The scorer's overflow model: a surge the primary cannot score in time goes to the cheaper model, a lone
request never does, overflow scores are not cached, and the gateway's default pairs the shipped artifacts."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import httpx
import pytest

from gateway.api.app import create_app
from gateway.cli.serve import _startup_problem
from gateway.costs.quality import with_quality
from gateway.settings import OPTIONS, Settings
from loadtest.scenarios.chaos_figures import ledger_records
from policies.loader import load_policy
from router_models.serving.artifact import DEFAULT_ARTIFACT, FAST_ARTIFACT, ArtifactError, overflow_artifact
from router_models.serving.classifier_scorer import BatchingConfig, ClassifierScorer, load_model, load_scorer
from router_models.serving.refined_model import RefinedClassifier
from router_models.serving.scorer import ConversationShape
from tests.conftest import SHARED_URL, delete_prefix, report_recent
from tests.servers import serve

ROOT = Path(__file__).resolve().parents[3]


class Model:
    """Scores every text `value`; sleeps `per_text` seconds per text (a CPU-bound model's cost)."""

    def __init__(self, value: float, per_text: float = 0.0) -> None:
        self.value = value
        self.per_text = per_text
        self.texts: list[str] = []

    def __call__(self, texts: Sequence[str], shapes: Sequence[ConversationShape] | None = None) -> list[float]:
        self.texts.extend(texts)
        time.sleep(self.per_text * len(texts))
        return [self.value] * len(texts)


async def test_a_lone_request_is_scored_by_the_primary_even_when_it_is_slow() -> None:
    primary, overflow = Model(0.7, per_text=0.03), Model(0.2)
    scorer = ClassifierScorer(primary, BatchingConfig(overflow_after_ms=10), overflow=overflow)
    for k in range(3):  # each alone: 30 ms > 10 ms, but the first text of a batch is never counted
        assert await scorer.score([f"lone {k}"]) == [0.7]
    assert scorer.scored_by == {"primary": 3, "overflow": 0} and not overflow.texts
    await scorer.aclose()


async def test_a_surge_goes_to_the_overflow_model_and_is_answered_in_time() -> None:
    primary, overflow = Model(0.7, per_text=0.02), Model(0.2)
    # one text per batch: the first goes to the primary, those that waited behind it to the overflow model
    scorer = ClassifierScorer(primary, BatchingConfig(workers=1, max_batch=1, overflow_after_ms=10),
                              overflow=overflow)
    seen: list[tuple[str, int]] = []
    scorer.on_scored = lambda model, texts: seen.append((model, texts))
    await scorer.score(["warm-up"])  # the primary's time per text is measured on real calls
    started = time.monotonic()
    texts = [f"surge {k}" for k in range(40)]
    scores = [s[0] for s in await asyncio.gather(*(scorer.score([t]) for t in texts))]
    took = time.monotonic() - started
    assert set(scores) == {0.7, 0.2}
    assert scorer.scored_by["overflow"] >= 30, scorer.scored_by
    assert took < 40 * 0.02 / 2, f"{took:.2f} s: the queue was not drained by the overflow model"
    assert sum(n for model, n in seen if model == "overflow") == scorer.scored_by["overflow"]
    # an overflow score is not cached: asked again at rest, the text gets the primary's score
    overflowed = next(t for t, s in zip(texts, scores, strict=True) if s == 0.2)
    assert await scorer.score([overflowed]) == [0.7]
    await scorer.aclose()


async def test_each_score_names_the_model_that_gave_it() -> None:
    primary, overflow = Model(0.7, per_text=0.02), Model(0.2)
    scorer = ClassifierScorer(primary, BatchingConfig(workers=1, max_batch=1, overflow_after_ms=10),
                              overflow=overflow)
    assert await scorer.score_one("warm-up") == (0.7, "primary")
    assert await scorer.score_one("warm-up") == (0.7, "primary")  # from the cache
    scored = await asyncio.gather(*(scorer.score_one(f"surge {k}") for k in range(20)))
    assert {pair for pair in scored} == {(0.7, "primary"), (0.2, "overflow")}
    assert sum(model == "overflow" for _, model in scored) == scorer.scored_by["overflow"]
    await scorer.aclose()


async def test_without_an_overflow_model_the_primary_scores_everything() -> None:
    primary = Model(0.7, per_text=0.005)
    scorer = ClassifierScorer(primary, BatchingConfig(workers=1, overflow_after_ms=1))
    scores = await asyncio.gather(*(scorer.score([f"t{k}"]) for k in range(30)))
    assert {s[0] for s in scores} == {0.7} and scorer.scored_by == {"primary": 30, "overflow": 0}
    await scorer.aclose()


async def test_the_overflow_model_attaches_when_loaded_and_a_failed_load_is_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    scorer = ClassifierScorer(Model(0.7))
    assert scorer.overflow_state == "none"
    gate = threading.Event()

    def slow_load() -> Model:
        gate.wait(5)
        return Model(0.2)

    thread = scorer.load_overflow_in_background(slow_load, "slow.json")
    assert scorer.overflow is None and await scorer.score(["while loading"]) == [0.7]
    assert scorer.overflow_state == "loading"
    gate.set()
    thread.join(5)
    assert isinstance(scorer.overflow, Model) and scorer.overflow_state == "ready"

    def broken() -> Model:
        raise ArtifactError("payload fails its sha256 check")

    other = ClassifierScorer(Model(0.7))
    with caplog.at_level(logging.WARNING, logger="router_models.serving.classifier_scorer"):
        other.load_overflow_in_background(broken, "broken.json").join(5)
    assert other.overflow is None and other.overflow_state == "failed"
    assert "router overflow model broken.json not loaded (payload fails its sha256 check)" in caplog.text
    await scorer.aclose()
    await other.aclose()


def test_auto_pairs_the_shipped_default_with_the_fast_artifact_and_nothing_else(tmp_path: Path) -> None:
    assert overflow_artifact(DEFAULT_ARTIFACT, "auto") == FAST_ARTIFACT
    assert overflow_artifact(FAST_ARTIFACT, "auto") is None  # already the fast one
    assert overflow_artifact(DEFAULT_ARTIFACT, "none") is None
    copy = tmp_path / "promoted"
    copy.mkdir()
    for suffix in (".json", ".npz"):
        shutil.copy(DEFAULT_ARTIFACT.with_suffix(suffix), copy / DEFAULT_ARTIFACT.with_suffix(suffix).name)
    assert overflow_artifact(copy / DEFAULT_ARTIFACT.name, "auto") is None  # another primary: no pairing
    assert overflow_artifact(copy / DEFAULT_ARTIFACT.name, str(FAST_ARTIFACT)) == FAST_ARTIFACT


def test_a_named_overflow_artifact_is_checked_at_start_up(tmp_path: Path) -> None:
    other = tmp_path / "other-target.json"
    meta = json.loads(FAST_ARTIFACT.read_text())
    meta["target"] = "gap"
    other.write_text(json.dumps(meta))
    shutil.copy(FAST_ARTIFACT.with_suffix(".npz"), tmp_path / FAST_ARTIFACT.with_suffix(".npz").name)
    with pytest.raises(ArtifactError, match=r"predicts 'gap' but the primary .* predicts 'irt-fail'"):
        overflow_artifact(DEFAULT_ARTIFACT, str(other))
    policy = ROOT / "policies" / "default.yaml"
    problem = _startup_problem(policy, "classifier", None, str(tmp_path / "missing.json"))
    assert problem is not None and "missing.json" in problem and "--scorer length|none" in problem
    assert _startup_problem(policy, "classifier", None, "auto") is None


def test_the_setting_defaults_to_auto_and_tests_run_without_it(monkeypatch: pytest.MonkeyPatch) -> None:
    option = next(o for o in OPTIONS if o.name == "router_overflow")
    assert option.flag == "--router-overflow" and option.env == "CASCADE_ROUTER_OVERFLOW"
    assert Settings(policy_path=Path("p.yaml")).router_overflow == "none"  # tests/conftest.py
    monkeypatch.delenv("CASCADE_ROUTER_OVERFLOW")
    assert Settings(policy_path=Path("p.yaml")).router_overflow == "auto"


@pytest.mark.slow
@pytest.mark.timing
async def test_the_shipped_scorer_overflows_a_real_surge_to_the_fast_artifact(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real models: the transformer primary alone (`CASCADE_ROUTER_REFINE=none`: the two stages of the default
    score a surge of 96 fast enough that none waits 50 ms) and the static overflow (its table is built on first use,
    about a minute on 2 cores, then cached). A surge of unique prompts is partly scored by the overflow model,
    with exactly the fast artifact's own scores; a lone prompt afterwards gets the primary's. Overflow after
    50 ms, not the default 10: the surge's later batches wait far longer, and a lone prompt's pickup on a busy
    machine (under pytest-xdist) can take more than 10 ms, which sent it to the overflow model. Two surges at most,
    of other prompts: a worker thread the host starves past 50 ms sends a whole surge to the overflow model, as it
    should (fc8 of 2026-12-07, four pytest-xdist workers on 2 cores: 96 of 96), which no surge can foresee."""
    monkeypatch.setenv("CASCADE_ROUTER_REFINE", "none")
    scorer = load_scorer(None, BatchingConfig(workers=1, overflow_after_ms=50), overflow="auto")
    deadline = time.monotonic() + 300
    while scorer.overflow is None and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert scorer.overflow is not None, "the overflow model did not load in 300 s"
    lines = (ROOT / "loadtest" / "data" / "synthetic_prompts.jsonl").read_text().splitlines()
    unique = list(dict.fromkeys(str(json.loads(line)["prompt"]) for line in lines))
    for surge in range(2):
        prompts = unique[96 * surge:96 * (surge + 1)]  # unseen: a primary score would come from the cache
        before = dict(scorer.scored_by)
        scores = [s[0] for s in await asyncio.gather(*(scorer.score([p]) for p in prompts))]
        counts = {model: scorer.scored_by[model] - before[model] for model in before}
        if counts["overflow"] > 0 and counts["primary"] > 0:
            break
        print(f"surge {surge}: {counts}")
    assert counts["overflow"] > 0 and counts["primary"] > 0, counts
    primary, fast = load_model(None, 1), load_model(str(FAST_ARTIFACT), 1)
    by_primary, by_fast = primary(prompts), fast(prompts)
    for prompt, score, p, f in zip(prompts, scores, by_primary, by_fast, strict=True):
        assert score == pytest.approx(p, abs=1e-6) or score == pytest.approx(f, abs=1e-6), prompt
    assert sum(s == pytest.approx(f, abs=1e-6) and f != pytest.approx(p, abs=1e-6)
               for s, p, f in zip(scores, by_primary, by_fast, strict=True)) > 0
    lone = prompts[-1] + " (asked again, alone)"
    assert (await scorer.score([lone]))[0] == pytest.approx(primary([lone])[0], abs=1e-6)
    await scorer.aclose()


def test_the_gateway_counts_each_scored_request_by_model(
        policy_file: Path, upstreams: tuple[object, str, object, str]) -> None:
    """A real gateway with the shipped artifact and `--router-overflow auto`: each routed request is counted
    once in `cascade_router_scored_total{model}`, under the model that scored it."""
    settings = Settings(policy_path=policy_file, scorer="classifier", start_engines=False, ledger="memory",
                        policy_watch_interval_s=0, router_overflow="auto")
    with serve(create_app(settings)) as url:
        for k in range(3):
            reply = httpx.post(f"{url}/v1/chat/completions", timeout=30, json={
                "model": "auto", "messages": [{"role": "user", "content": f"Summarise request number {k}."}]})
            assert reply.status_code == 200, reply.text
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
    counted = {model: float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               for model in ("primary", "overflow")
               if line.startswith(f'cascade_router_scored_total{{model="{model}"}}')}
    assert sum(counted.values()) == 3 and counted.get("primary", 0) >= 1, counted


@pytest.mark.slow
@pytest.mark.timing
@pytest.mark.redis
def test_what_the_overflow_model_scored_is_in_the_ledger_and_weighs_the_report(
        policy_file: Path, upstreams: tuple[object, str, object, str], tmp_path: Path) -> None:
    """A real gateway, the shipped artifacts and the real Redis ledger: a surge of unique prompts is partly
    scored by the overflow model; each cost record names its model, the rollups count the overflow ones, and
    the cost report weighs that share at the fast artifact's curve."""
    prefix = f"test:{uuid.uuid4().hex[:8]}:"
    settings = Settings(policy_path=policy_file, scorer="classifier", start_engines=False, ledger="redis",
                        redis_prefix=prefix, policy_watch_interval_s=0, router_overflow="auto", home=tmp_path)
    app = create_app(settings)
    lines = (ROOT / "loadtest" / "data" / "synthetic_prompts.jsonl").read_text().splitlines()
    prompts = list(dict.fromkeys(str(json.loads(line)["prompt"]) for line in lines))[:96]

    async def surge(url: str) -> list[int]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            replies = await asyncio.gather(*(client.post("/v1/chat/completions", json={
                "model": "auto", "messages": [{"role": "user", "content": p}]}) for p in prompts))
        assert {r.headers["x-cascade-scored-by"] for r in replies} <= {"primary", "overflow"}
        return [r.status_code for r in replies]

    try:
        with serve(app) as url:
            assert httpx.post(f"{url}/v1/chat/completions", timeout=60, json={  # starts the scorer
                "model": "auto", "messages": [{"role": "user", "content": "hello"}]}).status_code == 200
            scorer = app.state.runtime.scorer
            deadline = time.monotonic() + 300
            while scorer.overflow is None and time.monotonic() < deadline:
                time.sleep(0.2)
            assert scorer.overflow is not None, "the overflow model did not load in 300 s"
            assert asyncio.run(surge(url)) == [200] * len(prompts)
            overflowed = scorer.scored_by["overflow"]
        assert overflowed > 0, scorer.scored_by
        records = ledger_records(SHARED_URL, prefix)
        assert len(records) == len(prompts) + 1
        assert sum(r["scored_by"] == "overflow" for r in records) == overflowed
        assert {r["scored_by"] for r in records} == {"primary", "overflow"}
        report = asyncio.run(report_recent(prefix))
        assert report.total().counters.overflow_scored == overflowed
        policy = load_policy(policy_file).policy
        quality = with_quality(report, policy).quality
        assert quality is not None and quality.overflow_share == pytest.approx(overflowed / len(records))
        assert "scored by the router's overflow model, weighed at its curve" in quality.lines()[0]
    finally:
        delete_prefix(prefix)



async def test_the_shipped_default_overflows_to_its_own_front_loaded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two stages (the default): the fast artifact in front of the transformer is also the overflow model `auto`
    names, so the scorer serves the overflow with the front itself (one word-piece table in memory, ready at start)
    and scores a surge exactly as the fast artifact does."""
    monkeypatch.delenv("CASCADE_ROUTER_REFINE", raising=False)
    scorer = load_scorer(None, BatchingConfig(workers=1), overflow="auto")
    primary = scorer._model
    assert isinstance(primary, RefinedClassifier) and scorer.overflow is primary.fast
    assert scorer.overflow_state == "ready" and scorer.overflow_loader is None
    assert primary.fast.embedder is primary.embedder and primary.fast.router is primary.router
    texts = ["Summarise this paragraph in one line.", "Prove that the square root of 2 is irrational."]
    assert scorer.overflow(texts) == load_model(str(FAST_ARTIFACT), 1)(texts)
    await scorer.aclose()
