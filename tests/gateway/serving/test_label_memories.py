"""Label memories in the gateway, with the shipped router artifact: a tenant's labels move its own requests' scores
at once (no retraining), the decision names the memory, other tenants keep the router's score, and a memory file
that cannot be loaded leaves the previous one serving.

The prompts and labels are written here: they show that labels reach the score, never which prompt is harder."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import orjson
import pytest_asyncio

from gateway.control.metrics import GatewayMetrics
from gateway.ledger.record import CostRecord, validate_record
from gateway.serving.label_memories import LabelMemories
from gateway.serving.router import RequestRouter
from gateway.serving.schema import parse_chat_request
from policies.ladder import LadderState
from policies.loader import LoadedPolicy, parse_policy
from router_models.embedders.features import FEATURE_NAMES
from router_models.serving.artifact import DEFAULT_ARTIFACT
from router_models.serving.classifier import feature_matrix
from router_models.serving.classifier_scorer import ClassifierScorer, load_scorer
from router_models.serving.label_memory import LabelMemory
from router_models.serving.memory_file import memory_paths, save_memory
from tests.conftest import policy_yaml

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
