"""`cascade router score --memory` and `cascade router route --memory` apply a label memory exactly as the gateway
does: the CLI's moved scores equal the gateway's `LabelMemories` moves of the same prompts, and its per-tier
predictions equal the trade the gateway's router builds for a `routing.tiers` policy with that memory (the shipped
router artifact and pool map, the three-pool example's shared-model placements): a memory of gap labels only shifts
every tier by the gap move, one with labels per pool moves each labelled tier alone, and `cascade policy explain`
shows the same moves, and moves a two-pool policy's score as the gateway does. An unknown memory is refused with the
memories there are.

The prompts and labels are written here: they show that labels reach the score and the trade, never which prompt is
harder."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import pytest_asyncio

from gateway.cli.main import main
from gateway.serving.openai.schema import parse_chat_request
from gateway.serving.routing.label_memories import LabelMemories
from gateway.serving.routing.placements import with_placements
from gateway.serving.routing.router import RequestRouter
from gateway.telemetry.metrics import GatewayMetrics
from policies.decide import RouteDecision
from policies.ladder import LadderState
from policies.loader import load_policy
from policies.tiers import estimates_text
from router_models.embedders.features import FEATURE_NAMES
from router_models.serving.artifact import DEFAULT_ARTIFACT
from router_models.serving.classifier import feature_matrix
from router_models.serving.classifier_scorer import ClassifierScorer, load_scorer
from router_models.serving.label_memory import LabelMemory
from router_models.serving.memory_file import save_memory
from router_models.serving.score_file import parse_line
from router_models.serving.scorer import ScorerViews, read_conversation
from tests.conftest import policy_yaml

EXAMPLE = Path(__file__).resolve().parents[3] / "policies" / "examples" / "three-pools.yaml"
LABELLED = ["Summarise the attached contract and list every clause that conflicts with the others.",
            "Write a Python function that merges overlapping intervals, with tests.",
            "What is the capital of France?"]
PROMPTS: list[dict[str, Any]] = [
    {"id": "a", "prompt": LABELLED[0]},
    {"id": "b", "prompt": "Write a Python function that merges overlapping intervals."},
    {"id": "c", "messages": [{"role": "user", "content": "What is the capital of Spain?"}]},
    {"id": "d", "prompt": "Prove there are infinitely many primes of the form 4k+3."}]


@pytest_asyncio.fixture
async def scorer() -> AsyncIterator[ClassifierScorer]:
    scorer = load_scorer(str(DEFAULT_ARTIFACT), torch_threads=1)
    yield scorer
    await scorer.aclose()


@pytest_asyncio.fixture
async def store(scorer: ClassifierScorer, tmp_path: Path) -> Path:
    """A store whose shared memory labels the first two prompts as needing the flagship and the third as not."""
    await scorer.score(LABELLED)
    vectors = np.stack([v for t in LABELLED if (v := scorer.embedding(t)) is not None]).astype(np.float32)
    rows = feature_matrix(vectors, LABELLED)
    memory = LabelMemory(rows, np.asarray([1.0, 1.0, 0.5]), rows.shape[1] - len(FEATURE_NAMES))
    save_memory(memory, tmp_path / "store" / "memory" / "shared.json", embedder=scorer.embedding_space)
    return tmp_path / "store"


@pytest_asyncio.fixture
async def pool_store(scorer: ClassifierScorer, tmp_path: Path) -> Path:
    """A store whose shared memory says the code pool answered the second prompt badly and the general pool the
    third well (labels per pool only: no gap)."""
    await scorer.score(LABELLED)
    vectors = np.stack([v for t in LABELLED if (v := scorer.embedding(t)) is not None]).astype(np.float32)
    rows = feature_matrix(vectors, LABELLED)[1:]
    memory = LabelMemory(rows, np.full(2, np.nan), rows.shape[1] - len(FEATURE_NAMES), pools=("code", "general"),
                         qualities=np.asarray([[0.0, np.nan], [np.nan, 1.0]]))
    save_memory(memory, tmp_path / "pools" / "memory" / "shared.json", embedder=scorer.embedding_space)
    return tmp_path / "pools"


@pytest.fixture
def prompts(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return path


def _lines(path: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_score_moves_each_score_as_the_gateways_memory_does(scorer: ClassifierScorer, store: Path,
                                                                  prompts: Path, tmp_path: Path) -> None:
    out = tmp_path / "scores.jsonl"
    assert main(["router", "score", "--in", str(prompts), "--out", str(out), "--artifact", str(DEFAULT_ARTIFACT),
                 "--memory", "shared", "--store", str(store)]) == 0
    memories = LabelMemories(store / "memory", lambda: scorer)
    await memories.refresh()
    views = ScorerViews.of(scorer)
    moved_any = False
    for line, got in zip(prompts.read_text().splitlines(), _lines(out), strict=True):
        _, text, shape = parse_line(line)
        base, _ = await scorer.score_one(text, shape)
        served = memories.adjust("shared", views, text, base, shape)
        assert served is not None
        # a batch's similarities are one matrix product, a lone move's a vector product: float32 rounding apart
        assert got["score"] == pytest.approx(served.score, abs=2e-6)
        assert got["router_score"] == pytest.approx(base, abs=1e-6)
        assert got["pool"] == ("flagship" if got["score"] >= 0.5 else "micro")
        moved_any |= abs(served.score - base) > 0.01
    assert moved_any  # the labels reached the scores


async def test_route_shifts_every_tier_as_the_gateways_trade_does(scorer: ClassifierScorer, store: Path,
                                                                  prompts: Path, tmp_path: Path) -> None:
    out = tmp_path / "routes.jsonl"
    assert main(["router", "route", "--policy", str(EXAMPLE), "--in", str(prompts), "--out", str(out),
                 "--tradeoff", "0", "--artifact", str(DEFAULT_ARTIFACT), "--memory", "shared",
                 "--store", str(store)]) == 0
    plain = tmp_path / "plain.jsonl"
    assert main(["router", "route", "--policy", str(EXAMPLE), "--in", str(prompts), "--out", str(plain),
                 "--tradeoff", "0", "--artifact", str(DEFAULT_ARTIFACT)]) == 0
    decisions = await _served_decisions(scorer, store, tmp_path)
    for decision, got, before in zip(decisions, _lines(out), _lines(plain), strict=True):
        assert decision.trade is not None and decision.router_version.endswith("+memory/shared@3")
        served = {e.pool: e.quality for e in decision.trade.estimates}
        assert got["predicted"] == pytest.approx(served, abs=1e-5)
        assert got["pool"] == decision.pool
        tiers = list(served)  # the bottom tier falls and the top one rises by the move, the middle one stays
        shift = [got["predicted"][p] - before["predicted"][p] for p in tiers]
        assert shift == pytest.approx([-got["gap_move"], 0.0, got["gap_move"]], abs=2e-6)
    assert max(abs(r["gap_move"]) for r in _lines(out)) > 0.01


async def _served_decisions(scorer: ClassifierScorer, store: Path, tmp_path: Path) -> list[RouteDecision]:
    """The decision the gateway's router makes for each prompt under the three-pool example with `store`'s shared
    memory (tradeoff 0), each with its trade."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(EXAMPLE.read_text().replace('cost_per_1k: "2.00"', "tradeoff: 0")
                      + "learning:\n  label_memory:\n    scope: shared\n")
    loaded = with_placements(load_policy(policy))
    memories = LabelMemories(store / "memory", lambda: scorer)
    await memories.refresh()
    router = RequestRouter(scorer, GatewayMetrics(dict), memories=memories)
    decisions = []
    for prompt in PROMPTS:
        messages = prompt.get("messages") or [{"role": "user", "content": prompt["prompt"]}]
        request, raw = parse_chat_request(orjson.dumps({"model": "auto", "messages": messages}))
        decisions.append(await router.route(request, raw, "acme", {}, loaded, LadderState()))
        assert decisions[-1].trade is not None
    return decisions


async def test_labels_per_pool_move_each_labelled_tier_alone_as_the_gateways_trade_does(
        scorer: ClassifierScorer, pool_store: Path, prompts: Path, tmp_path: Path) -> None:
    out, plain = tmp_path / "routes.jsonl", tmp_path / "plain.jsonl"
    common = ["router", "route", "--policy", str(EXAMPLE), "--in", str(prompts), "--tradeoff", "0",
              "--artifact", str(DEFAULT_ARTIFACT)]
    assert main([*common, "--out", str(out), "--memory", "shared", "--store", str(pool_store)]) == 0
    assert main([*common, "--out", str(plain)]) == 0
    trades = [d.trade for d in await _served_decisions(scorer, pool_store, tmp_path) if d.trade is not None]
    lines, before = _lines(out), _lines(plain)
    for got, was, trade in zip(lines, before, trades, strict=True):
        assert trade.memory == "shared@2"
        assert got["predicted"] == pytest.approx({e.pool: e.quality for e in trade.estimates}, abs=1e-5)
        assert got["memory_move"] == pytest.approx({e.pool: e.memory for e in trade.estimates}, abs=1e-5)
        assert got["memory_move"]["flagship"] == 0.0 and got["gap_move"] == 0.0  # no label of it; no gap label
        for pool, move in got["memory_move"].items():
            # three figures each rounded to 6 decimals in the file
            assert got["predicted"][pool] == pytest.approx(was["predicted"][pool] + move, abs=2e-6)
    by_id = {line["id"]: line for line in lines}
    assert by_id["b"]["memory_move"]["code"] < -0.05  # near the prompt the code pool answered badly
    assert by_id["c"]["memory_move"]["general"] > 0.01  # near the one the general pool answered well
    assert "(memory -" in estimates_text(trades[1].estimates)  # what x-cascade-tiers and the cost record carry


def test_explain_shows_each_tiers_memory_move(pool_store: Path, prompts: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("CASCADE_ROUTER_ARTIFACT", str(DEFAULT_ARTIFACT))
    out = tmp_path / "routes.jsonl"
    assert main(["router", "route", "--policy", str(EXAMPLE), "--in", str(prompts), "--tradeoff", "0",
                 "--artifact", str(DEFAULT_ARTIFACT), "--out", str(out), "--memory", "shared",
                 "--store", str(pool_store)]) == 0
    routed = _lines(out)[1]
    capsys.readouterr()
    assert main(["policy", "explain", str(EXAMPLE), "--prompt", PROMPTS[1]["prompt"], "--tradeoff", "0",
                 "--memory", "shared", "--store", str(pool_store)]) == 0
    shown = capsys.readouterr().out
    assert "label memory shared@2 applied" in shown
    code = next(line for line in shown.splitlines() if line.startswith("  code: quality"))
    assert code.startswith(f"  code: quality {routed['predicted']['code']:.3f} "
                           f"(label memory {routed['memory_move']['code']:+.3f})")
    assert main(["policy", "explain", str(EXAMPLE), "--prompt", "hi", "--memory", "acme",
                 "--store", str(pool_store)]) == 1
    assert "no label memory" in capsys.readouterr().err


async def _served(store: Path, prompt: str, threshold: float = 0.5) -> tuple[float, float]:
    """(the classifier's score of `prompt`, the gateway's `LabelMemories` move of it by the shared memory), with a
    two-stage scorer's band around `threshold`, as the gateway's router puts it for a policy with that threshold."""
    scorer = load_scorer(str(DEFAULT_ARTIFACT), torch_threads=1)
    scorer.refine_near(threshold)
    try:
        memories = LabelMemories(store / "memory", lambda: scorer)
        await memories.refresh()
        text, shape = read_conversation([{"role": "user", "content": prompt}])
        base, _ = await scorer.score_one(text, shape)
        served = memories.adjust("shared", ScorerViews.of(scorer), text, base, shape)
        assert served is not None
        return base, served.score
    finally:
        await scorer.aclose()


def test_explain_moves_a_two_pool_policys_score_as_the_gateways_memory_does(
        store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("CASCADE_ROUTER_ARTIFACT", str(DEFAULT_ARTIFACT))
    base, moved = asyncio.run(_served(store, LABELLED[0]))
    assert abs(moved - base) > 0.01  # the labels reach this prompt's score
    threshold = (base + moved) / 2  # the memory's move crosses it
    base, moved = asyncio.run(_served(store, LABELLED[0], threshold))  # scored as for a policy with that threshold
    assert min(base, moved) < threshold < max(base, moved)
    policy = tmp_path / "two-pools.yaml"
    policy.write_text(policy_yaml("http://127.0.0.1:9", "http://127.0.0.1:9", """
learning:
  label_memory:
    scope: shared
""").replace("threshold: 0.5", f"threshold: {threshold:.6f}"))
    common = ["policy", "explain", str(policy), "--prompt", LABELLED[0], "--store", str(store)]
    capsys.readouterr()
    for argv in (common, [*common, "--memory", "shared"]):  # the policy's scope, or named
        assert main(argv) == 0
        shown = capsys.readouterr().out
        score = next(line for line in shown.splitlines() if line.startswith("score:"))
        assert score.startswith(f"score:    {moved:.4f} (classifier {base:.4f}, moved by label memory "
                                f"shared@3 {moved - base:+.4f})"), score
        assert f"decision: pool {'flagship' if moved > base else 'micro'!r}" in shown
    policy.write_text(policy.read_text().replace("scope: shared", "scope: none"))
    assert main(common) == 0  # no memory: the classifier's score, the other pool
    shown = capsys.readouterr().out
    assert f"score:    {base:.4f} (classifier)" in shown
    assert f"decision: pool {'micro' if moved > base else 'flagship'!r}" in shown


@pytest.mark.parametrize("command", ["score", "route"])
def test_an_unknown_memory_is_refused_with_the_memories_there_are(store: Path, prompts: Path, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str],
                                                                  command: str) -> None:
    extra = ["--policy", str(EXAMPLE)] if command == "route" else []
    for name, words in (("acme", "no label memory"), ("bad name!", "must be 1-40 letters")):
        assert main(["router", command, *extra, "--in", str(prompts), "--out", str(tmp_path / "o.jsonl"),
                     "--artifact", str(DEFAULT_ARTIFACT), "--memory", name, "--store", str(store)]) == 2
        err = capsys.readouterr().err
        assert words in err and err.startswith("error: ")
    main(["router", command, *extra, "--in", str(prompts), "--out", str(tmp_path / "o.jsonl"),
          "--artifact", str(DEFAULT_ARTIFACT), "--memory", "acme", "--store", str(store)])
    assert f"memories in {store / 'memory'}: shared)" in capsys.readouterr().err
