"""Label memories in the gateway, with the shipped router artifact: a tenant's labels move its own requests' scores
at once (no retraining), the decision names the memory, other tenants keep the router's score, a memory whose
similarity reads the structural columns moves scores from the feature rows the scorer kept (a scorer that keeps
none refuses it), a memory file that cannot be loaded leaves the previous one serving, and a memory grown under
steady traffic fails no request.

The prompts and labels are written here: they show that labels reach the score, never which prompt is harder."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
import orjson
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from gateway.api.app import create_app
from gateway.api.auth import OPEN_TENANT
from gateway.cli.main import main
from gateway.ledger.record import CostRecord, validate_record
from gateway.serving.openai.schema import parse_chat_request
from gateway.serving.routing import memory_batches
from gateway.serving.routing.label_memories import LabelMemories
from gateway.serving.routing.router import RequestRouter
from gateway.settings import Settings
from gateway.telemetry.metrics import GatewayMetrics
from loadtest.scenarios.change import add_memory_then_wait, figures, measure_change
from policies.ladder import LadderState
from policies.loader import LoadedPolicy, parse_policy
from router_models.embedders.features import FEATURE_NAMES
from router_models.embedders.onnx_minilm import default_cache_dir
from router_models.serving.artifact import DEFAULT_ARTIFACT
from router_models.serving.classifier import feature_matrix
from router_models.serving.classifier_scorer import ClassifierScorer, load_scorer
from router_models.serving.label_memory import LabelMemory, MemoryParams, MemoryRouter
from router_models.serving.memory_file import load_memory, memory_paths, save_memory
from router_models.serving.scorer import ConversationShape, ScorerViews, read_conversation
from tests.conftest import policy_yaml
from tests.servers import serve

HARD = "Summarise the attached contract and list every clause that conflicts with the others."
EASY = "What is the capital of France?"


_RECORDED_AT = 1_767_225_600.0


def _record(router_version: str) -> CostRecord:
    return CostRecord(request_id="req-1", tenant="acme", pool="micro", model="micro-model", prompt_tokens=10,
                      completion_tokens=2, cost_micro_usd=5, flagship_cost_micro_usd=50, rule="default",
                      policy_version="v1", started_at=_RECORDED_AT, ttft_ms=1.0, latency_ms=2.0,
                      scored_by="primary", router_version=router_version)


def _policy(scope: str) -> LoadedPolicy:
    return parse_policy(policy_yaml("http://127.0.0.1:9", "http://127.0.0.1:9",
                                    f"learning:\n  label_memory:\n    scope: {scope}\n"))


@pytest_asyncio.fixture
async def scorer() -> AsyncIterator[ClassifierScorer]:
    scorer = load_scorer(str(DEFAULT_ARTIFACT), torch_threads=1)
    scorer.refine_near(0.5)  # a two-stage scorer's band where the router puts it for `_policy` (threshold 0.5)
    yield scorer
    await scorer.aclose()


async def _rows(scorer: ClassifierScorer, texts: list[str]) -> npt.NDArray[np.float32]:
    await scorer.score(texts)
    vectors = np.stack([v for t in texts if (v := scorer.embedding(t)) is not None])
    return feature_matrix(vectors.astype(np.float32), texts)


async def _route(router: RequestRouter, text: str, tenant: str, loaded: LoadedPolicy) -> tuple[float, str]:
    request, raw = parse_chat_request(orjson.dumps({"model": "auto", "messages": [{"role": "user",
                                                                                    "content": text}]}))
    decision = await router.route(request, raw, tenant, {}, loaded, LadderState())
    assert decision.score is not None
    return decision.score, decision.router_version


async def test_a_tenants_labels_move_its_scores_at_once_and_no_one_elses(scorer: ClassifierScorer,
                                                                        tmp_path: Path) -> None:
    folder = tmp_path / "memory"
    rows = await _rows(scorer, [HARD, EASY])
    memory = LabelMemory(rows, np.asarray([1.0, 0.5]), rows.shape[1] - len(FEATURE_NAMES))
    save_memory(memory, folder / "acme.json", embedder=scorer.embedding_space)
    memories = LabelMemories(folder, lambda: scorer)
    await memories.refresh()
    assert memories.names() == ["acme"]
    router = RequestRouter(scorer, GatewayMetrics(dict), memories=memories)
    base, _ = await scorer.score_one(HARD)
    moved, version = await _route(router, HARD, "acme", _policy("tenant"))
    assert moved > base + 0.01 and version == f"{scorer.version}+memory/acme@2"
    validate_record(_record(version), now=_RECORDED_AT)  # the ledger takes the version as a record's name
    assert await _route(router, HARD, "other", _policy("tenant")) == (base, scorer.version)
    assert await _route(router, HARD, "acme", _policy("none")) == (base, scorer.version)

    _, payload = memory_paths(folder / "acme.json")
    payload.write_bytes(b"not a memory")  # a broken write: the memory loaded before keeps serving
    await memories.refresh()
    assert (await _route(router, HARD, "acme", _policy("tenant")))[0] == moved


async def test_the_shipped_artifacts_per_source_routers_are_read_by_a_default_memory(scorer: ClassifierScorer) -> None:
    """The artifact carries one router per public source; a memory with the default `sources` reads the router
    together with them (so it needs the request's whole feature row), one with `sources` 0 reads the router alone."""
    router = scorer.router
    assert router is not None
    sources = router.sources
    assert sources is not None and set(sources.names) == set(json.loads(DEFAULT_ARTIFACT.read_text())["sources"])
    rows = await _rows(scorer, [HARD, EASY])
    width = rows.shape[1] - len(FEATURE_NAMES)
    combined = MemoryRouter.attach(router, LabelMemory(rows, np.asarray([1.0, 0.5]), width))
    assert combined.source_logits.shape == (2, len(sources.names)) and combined.reads_features
    alone = MemoryRouter.attach(router, LabelMemory(rows, np.asarray([1.0, 0.5]), width, EMBEDDING_ONLY))
    assert alone.source_logits.shape == (2, 0) and not alone.reads_features


async def test_a_memory_past_inline_labels_is_moved_in_a_worker_thread_in_batches_to_the_same_scores(
        scorer: ClassifierScorer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Moves that wait together are computed as one batch, in a worker thread, each to the score the event loop's
    own move gives, to the float32 rounding of the similarities (a batch is one matrix product where a lone move is
    a vector product: ~1e-7 apart, ten times that through the weights' exp((s - 1) / 0.1))."""
    folder, texts = tmp_path / "memory", [HARD, EASY, "Translate 'good morning' into French."]
    rows = await _rows(scorer, texts)
    save_memory(LabelMemory(rows, np.asarray([1.0, 0.5, 0.5]), rows.shape[1] - len(FEATURE_NAMES)),
                folder / "acme.json", embedder=scorer.embedding_space)
    threads: list[int] = []
    compute = memory_batches._compute

    def recorded(batch: Any) -> list[float | Exception]:
        threads.append(threading.get_ident())
        return compute(batch)

    monkeypatch.setattr(memory_batches, "_compute", recorded)
    views = ScorerViews.of(scorer)
    bases = [(await scorer.score_one(t))[0] for t in texts]
    memories = LabelMemories(folder, lambda: scorer, inline_labels=2)  # the memory holds 3: moved off the loop
    metrics = GatewayMetrics(dict)
    memories.on_inline, memories.on_batch = metrics.memory_moves.labels("inline").inc, metrics.memory_batch_moved
    await memories.refresh()
    inline = [memories.adjust("acme", views, t, b) for t, b in zip(texts, bases, strict=True)]
    batched = await asyncio.gather(*(memories.adjust_off_loop("acme", views, t, b)
                                     for t, b in zip(texts * 4, bases * 4, strict=True)))
    assert all(m is not None for m in inline) and inline[0] is not None and inline[0].score > bases[0] + 0.01
    for got, want in zip(batched, inline * 4, strict=True):
        assert got is not None and want is not None
        assert (got.name, got.labels) == (want.name, want.labels) == ("acme", 3)
        assert got.score == pytest.approx(want.score, rel=1e-5)
    # all twelve were waiting when the first batch was sent: one batch of 12 (and the 3 inline moves)
    assert _memory_metrics(metrics) == {"inline": 3.0, "batched": 12.0, "batches": 1.0, "batched_sum": 12.0}
    assert await memories.adjust_off_loop("acme", views, HARD, bases[0]) == inline[0]  # a batch of one: exact
    assert _memory_metrics(metrics) == {"inline": 3.0, "batched": 13.0, "batches": 2.0, "batched_sum": 13.0}
    assert threads and threading.get_ident() not in threads


def _memory_metrics(metrics: GatewayMetrics) -> dict[str, float]:
    """`/metrics`' label-memory moves by path, and the batch-size histogram's count and sum."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            if sample.name == "cascade_label_memory_moves_total":
                out[sample.labels["path"]] = sample.value
            elif sample.name == "cascade_label_memory_batch_size_count":
                out["batches"] = sample.value
            elif sample.name == "cascade_label_memory_batch_size_sum":
                out["batched_sum"] = sample.value
    return out


async def test_a_move_that_fails_routes_on_the_routers_own_score_and_says_so(
        scorer: ClassifierScorer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    memories = LabelMemories(tmp_path / "memory", lambda: scorer)

    async def broken(*args: object) -> None:
        raise ValueError("the memory's rows cannot be read")

    monkeypatch.setattr(memories, "adjust_off_loop", broken)
    router = RequestRouter(scorer, GatewayMetrics(dict), memories=memories)
    base, _ = await scorer.score_one(HARD)
    with caplog.at_level(logging.ERROR, logger="cascade.router"):
        assert await _route(router, HARD, "acme", _policy("tenant")) == (base, scorer.version)
    assert [r.getMessage() for r in caplog.records if r.name == "cascade.router"] == [
        "label memory did not move the score; routing on the router's"]


def _unloadable(folder: Path, embedder: str) -> dict[str, Callable[[], object]]:
    """Ways a memory file fails its checks, each applied to `folder`'s acme memory."""
    meta, payload = memory_paths(folder / "acme.json")

    def edit_meta(**changes: object) -> None:
        meta.write_text(json.dumps({**json.loads(meta.read_text()), **changes}))

    def other_embedder() -> None:
        memory, _ = load_memory(meta, embedder=embedder)
        save_memory(memory, meta, embedder="all-MiniLM-L6-v2:static")

    return {"corrupt metadata": lambda: meta.write_text("{not json"),
            "wrong format": lambda: edit_meta(memory_format=99),
            "hash mismatch": lambda: payload.write_bytes(payload.read_bytes()[:-10]),  # a copy cut short
            "another embedder": other_embedder}


REASONS = {"corrupt metadata": "label memory metadata .* is unreadable", "wrong format": "has memory_format=99 but",
           "hash mismatch": "fails its sha256 check",
           "another embedder": "holds vectors of 'all-MiniLM-L6-v2:static', but the router embeds with"}


@pytest.mark.parametrize("broken", sorted(REASONS))
async def test_a_memory_that_fails_its_checks_leaves_the_previous_one_serving_and_says_why(
        scorer: ClassifierScorer, tmp_path: Path, caplog: pytest.LogCaptureFixture, broken: str) -> None:
    folder = tmp_path / "memory"
    rows = await _rows(scorer, [HARD, EASY])
    save_memory(LabelMemory(rows, np.asarray([1.0, 0.5]), rows.shape[1] - len(FEATURE_NAMES)), folder / "acme.json",
                embedder=scorer.embedding_space)
    memories = LabelMemories(folder, lambda: scorer)
    await memories.refresh()
    base, _ = await scorer.score_one(HARD)
    before = memories.adjust("acme", ScorerViews.of(scorer), HARD, base)
    assert before is not None and before.score > base + 0.01 and before.labels == 2
    _unloadable(folder, scorer.embedding_space)[broken]()
    with caplog.at_level(logging.WARNING, logger="cascade.router"):
        await memories.refresh()
    warned = [r.getMessage() for r in caplog.records if r.name == "cascade.router"]
    assert len(warned) == 1 and warned[0].startswith("label memory acme not loaded (")
    assert warned[0].endswith("; the previous one keeps serving") and re.search(REASONS[broken], warned[0])
    assert memories.adjust("acme", ScorerViews.of(scorer), HARD, base) == before


STRUCTURAL, EMBEDDING_ONLY = MemoryParams(structure=0.3, sources=0.0), MemoryParams(structure=0.0, sources=0.0)
CHAT = [{"role": "system", "content": "You review contracts for a law firm."},
        {"role": "user", "content": "Here is the contract. " + "Clause text. " * 80},
        {"role": "assistant", "content": "I have read it."}, {"role": "user", "content": HARD}]


async def _features(scorer: ClassifierScorer, messages: Sequence[dict[str, str]]) -> npt.NDArray[np.float32]:
    """The feature row the scorer kept when it scored `messages`, checked against the same row computed anew."""
    text, shape = read_conversation(messages)
    await scorer.score_one(text, shape)
    row, vector = scorer.features(text, shape), scorer.embedding(text)
    assert row is not None and vector is not None
    again = feature_matrix(vector[None, :].astype(np.float32), [text], [shape])[0]
    assert row.shape == again.shape and np.allclose(row, again, rtol=0, atol=1e-6)  # the same float32 sums
    return row


async def test_a_memory_on_the_structural_columns_moves_scores_from_the_rows_the_scorer_kept(
        scorer: ClassifierScorer, tmp_path: Path) -> None:
    """Served at no extra cost per request: the rows are the ones the scorer computed when it scored, and a
    conversation (system prompt, turns, a long earlier turn) is looked up by its shape, not as a plain prompt."""
    assert scorer.keeps_features
    chat = [{"role": "user", "content": "Reply with one word: hello."}, {"role": "assistant", "content": "hello"},
            {"role": "user", "content": EASY}]
    rows = np.stack([await _features(scorer, [{"role": "user", "content": t}]) for t in (HARD, EASY)]
                    + [await _features(scorer, CHAT), await _features(scorer, chat)])
    save_memory(LabelMemory(rows, np.asarray([1.0, 0.5, 1.0, 0.5]), rows.shape[1] - len(FEATURE_NAMES), STRUCTURAL),
                tmp_path / "memory" / "acme.json", embedder=scorer.embedding_space)
    memories = LabelMemories(tmp_path / "memory", lambda: scorer)
    await memories.refresh()
    assert memories.names() == ["acme"] and memories.labels("acme") == 4
    router = RequestRouter(scorer, GatewayMetrics(dict), memories=memories)
    base, _ = await scorer.score_one(HARD)
    moved, version = await _route(router, HARD, "acme", _policy("tenant"))
    assert moved > base + 0.01 and version == f"{scorer.version}+memory/acme@4"
    request, raw = parse_chat_request(orjson.dumps({"model": "auto", "messages": CHAT}))
    decision = await router.route(request, raw, "acme", {}, _policy("tenant"), LadderState())
    chat_base, _ = await scorer.score_one(*read_conversation(CHAT))
    assert decision.score is not None and decision.score > chat_base + 0.01
    assert decision.router_version == version
    text, _ = read_conversation(CHAT)
    unseen = ConversationShape(user_turns=5, total_chars=9_000, latest_chars=len(HARD))
    assert memories.adjust("acme", ScorerViews.of(scorer), text, chat_base, unseen) is None  # not scored in that shape
    assert await _route(router, HARD, "other", _policy("tenant")) == (base, scorer.version)


class EmbeddingsOnly:
    """The real scorer seen as one that keeps embeddings but no feature rows (`Scorer` + `EmbeddingSource`)."""

    def __init__(self, real: ClassifierScorer) -> None:
        self.real, self.router = real, real.router
        self.version, self.embedding_space = real.version, real.embedding_space

    def embedding(self, text: str) -> npt.NDArray[np.float32] | None:
        return self.real.embedding(text)

    async def score(self, texts: Sequence[str]) -> list[float]:
        return await self.real.score(texts)

    async def score_one(self, text: str, shape: ConversationShape | None = None) -> tuple[float, str]:
        return await self.real.score_one(text, shape)

    async def aclose(self) -> None:
        return None


async def test_a_scorer_without_feature_rows_refuses_a_structural_memory_and_the_previous_one_serves(
        scorer: ClassifierScorer, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder, plain = tmp_path / "memory", EmbeddingsOnly(scorer)
    rows = await _rows(scorer, [HARD, EASY])
    memory = LabelMemory(rows, np.asarray([1.0, 0.5]), rows.shape[1] - len(FEATURE_NAMES), EMBEDDING_ONLY)
    save_memory(memory, folder / "acme.json", embedder=scorer.embedding_space)
    memories = LabelMemories(folder, lambda: plain)
    await memories.refresh()
    base, _ = await scorer.score_one(HARD)
    before = memories.adjust("acme", ScorerViews.of(plain), HARD, base)
    assert before is not None and before.score > base + 0.01
    save_memory(replace(memory, params=STRUCTURAL), folder / "acme.json", embedder=scorer.embedding_space)
    with caplog.at_level(logging.WARNING, logger="cascade.router"):
        await memories.refresh()
    warned = [r.getMessage() for r in caplog.records if r.name == "cascade.router"]
    assert len(warned) == 1 and re.search("reads the structural columns .* which this scorer does not keep", warned[0])
    assert warned[0].endswith("; the previous one keeps serving")
    assert memories.adjust("acme", ScorerViews.of(plain), HARD, base) == before


def _answer(url: str, text: str) -> tuple[str, str]:
    reply = httpx.post(f"{url}/v1/chat/completions", timeout=30,
                       json={"model": "auto", "messages": [{"role": "user", "content": text}]})
    assert reply.status_code == 200, reply.text
    return reply.headers["x-cascade-router-version"], reply.headers["x-cascade-score"]


def _until(url: str, suffix: str, timeout_s: float = 30.0) -> tuple[str, str]:
    deadline = time.monotonic() + timeout_s
    while not (answer := _answer(url, HARD))[0].endswith(suffix):
        assert time.monotonic() < deadline, f"router version still {answer[0]}, not ...{suffix}"
        time.sleep(0.2)
    return answer


def _gateway_files(upstreams: tuple[object, str, object, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                   scope: str) -> tuple[Path, Path, Path]:
    """(CASCADE_HOME, a policy in front of the fake upstreams whose label memory scope is `scope`, a two-row label
    file) for a real app; CASCADE_HOME is set to that home, whose embedder cache is the session's (built once)."""
    _, micro_url, _, flagship_url = upstreams
    home, cache = tmp_path / "home", default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    home.mkdir()
    (home / "router-cache").symlink_to(cache, target_is_directory=True)
    monkeypatch.setenv("CASCADE_HOME", str(home))
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml(micro_url, flagship_url, f"learning:\n  label_memory:\n    scope: {scope}\n"))
    labels = tmp_path / "labels.jsonl"
    labels.write_text(json.dumps({"prompt": HARD, "needs_flagship": 1}) + "\n"
                      + json.dumps({"prompt": EASY, "needs_flagship": 0}) + "\n")
    return home, policy, labels


def test_through_the_gateway_an_unloadable_memory_leaves_the_previous_one_serving(
        upstreams: tuple[object, str, object, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The real app: `cascade router memory add` writes the open tenant's memory, the gateway's poll loads it,
    a corrupt metadata file is logged and the memory loaded before keeps moving scores, and a good file after it
    is loaded again (the poll did not stop at the failure)."""
    home, policy, labels = _gateway_files(upstreams, tmp_path, monkeypatch, "tenant")
    add = ["router", "memory", "add", "--tenant", OPEN_TENANT, "--artifact", str(DEFAULT_ARTIFACT), "--labels"]
    assert main([*add, str(labels)]) == 0
    meta, payload = memory_paths(home / "router" / "memory" / f"{OPEN_TENANT}.json")
    good = meta.read_bytes(), payload.read_bytes()
    assert load_memory(meta)[0].params.structure > 0  # the default: served from the feature rows the scorer keeps
    settings = Settings(policy_path=policy, scorer="classifier", router_artifact=DEFAULT_ARTIFACT, ledger="memory",
                        start_engines=False, policy_watch_interval_s=0, home=home)
    with caplog.at_level(logging.WARNING, logger="cascade.router"), serve(create_app(settings)) as url:
        version, score = _until(url, f"+memory/{OPEN_TENANT}@2")
        meta.write_text("{not json")
        deadline = time.monotonic() + 30
        while not any("not loaded" in r.getMessage() for r in caplog.records if r.name == "cascade.router"):
            assert time.monotonic() < deadline, "the gateway never tried the corrupt memory"
            time.sleep(0.2)
        assert _answer(url, HARD) == (version, score)
        meta.write_bytes(good[0])
        payload.write_bytes(good[1])
        assert main([*add, str(labels)]) == 0
        grown, moved = _until(url, f"+memory/{OPEN_TENANT}@4")
    warned = [r.getMessage() for r in caplog.records if r.name == "cascade.router"]
    assert warned[0] == (f"label memory {OPEN_TENANT} not loaded (label memory metadata {meta} is unreadable "
                         "(Expecting property name enclosed in double quotes: line 1 column 2 (char 1)); rebuild it "
                         "with `cascade router memory add` from the label files); the previous one keeps serving")
    assert grown == version.replace("@2", "@4") and moved != "none"


def test_a_memory_grown_under_steady_traffic_fails_no_request(
        upstreams: tuple[object, str, object, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The change scenario's `--memory-add` against the real app: SDK clients (one streaming) send scored requests
    back to back while labels are appended twice; each growth is applied (an answer names the memory at its new
    size) and no request fails."""
    home, policy, labels = _gateway_files(upstreams, tmp_path, monkeypatch, "shared")
    settings = Settings(policy_path=policy, scorer="classifier", router_artifact=DEFAULT_ARTIFACT, ledger="memory",
                        start_engines=False, policy_watch_interval_s=0, home=home)
    with serve(create_app(settings)) as url:
        for size in (2, 4):
            change = add_memory_then_wait(url, [labels], None, artifact=DEFAULT_ARTIFACT, timeout_s=30)
            answer, began, applied, outcomes = asyncio.run(measure_change(url, change, steady_s=0.5, after_s=0.5))
            assert isinstance(answer, httpx.Response)
            assert answer.headers["x-cascade-router-version"].endswith(f"+memory/shared@{size}")
            result = figures(outcomes, began, applied)
            assert result["failed"] == 0 and result["during"]["requests"] > 0, result  # clients are always in flight


class _CountingMap:
    """A quality model that predicts 0.5 for every tier and counts the label rows it was asked about."""

    def __init__(self) -> None:
        self.rows = 0

    def quality(self, features: npt.NDArray[np.float32], placements: Sequence[Any]) -> npt.NDArray[np.float64]:
        self.rows += len(features)
        return np.full((len(features), len(placements)), 0.5)


async def test_labels_per_pool_are_read_against_the_placements_once_until_they_change(scorer: ClassifierScorer,
                                                                                       tmp_path: Path) -> None:
    rows = await _rows(scorer, [HARD, EASY])
    memory = LabelMemory(rows, np.full(2, np.nan), rows.shape[1] - len(FEATURE_NAMES), pools=("code", "general"),
                         qualities=np.asarray([[0.0, np.nan], [np.nan, 1.0]]))
    save_memory(memory, tmp_path / "memory" / "shared.json", embedder=scorer.embedding_space)
    memories = LabelMemories(tmp_path / "memory", lambda: scorer)
    await memories.refresh()
    model, placements, tiers = _CountingMap(), (object(), object(), object()), ("general", "code", "flagship")
    first = await memories.tier_moves("shared", rows[0], tiers, placements, model)
    again = await memories.tier_moves("shared", rows[0], tuple(list(tiers)), placements, model)
    assert first == again and model.rows == 2  # the residuals were computed once, on the 2 labels
    assert first is not None and first[1] < -0.1 and first[2] == 0.0  # HARD's own label: code falls; no flagship one
    assert abs(first[0]) < abs(first[1]) / 5  # the general label is EASY's, far from HARD
    await memories.tier_moves("shared", rows[0], tiers, (object(), *placements[1:]), model)
    assert model.rows == 4  # a placement reloaded: read against it afresh
    assert await memories.tier_moves("other", rows[0], tiers, placements, model) is None
