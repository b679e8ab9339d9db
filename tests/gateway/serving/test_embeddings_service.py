"""The embeddings service over fakes, for a batch line (`BatchTag`): it waits in the lane on its embedding pool once
admitted (an interactive request never does), wakes no sleeping pool unless the policy's `batches.wake_on_demand`
lets it, and its record carries its batch id and custom_id, priced at the pool's batch discount."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from gateway.control.policy.policy_holder import PolicyHolder
from gateway.errors import NoReplicaAvailable
from gateway.ledger.store import MemoryLedger
from gateway.serving.embeddings import EmbeddingService
from gateway.serving.openai.embeddings_schema import parse_embeddings_request
from gateway.serving.records.accounting import Accountant
from gateway.serving.routing.request_context import BatchTag
from gateway.serving.serving_parts import ServingParts
from gateway.telemetry.metrics import GatewayMetrics
from gateway.tenancy.admission import Admission
from loadtest.fake_embeddings import embeddings_json
from policies.batches import discounted
from policies.decide import RouteDecision
from policies.loader import LoadedPolicy, parse_policy
from tests.conftest import policy_yaml

EMBED = """  embed:
    type: remote
    kind: embedding
    urls: ["http://127.0.0.1:9/v1"]
    model: embed-model
    price: {input_per_mtok: "100.00"}
"""
TAG = BatchTag("batch_1", "line-1")


def _loaded(extra: str = "") -> LoadedPolicy:
    text = policy_yaml("http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1", extra)
    return parse_policy(text.replace("routing:\n", EMBED + "routing:\n", 1))


class _Lane:
    def __init__(self) -> None:
        self.entered: list[tuple[str, str]] = []
        self.told: list[str] = []

    async def enter(self, loaded: LoadedPolicy, pool: str, request_id: str) -> None:
        self.entered.append((pool, request_id))

    async def arrived(self, loaded: LoadedPolicy, pool: str) -> None:
        self.told.append(pool)


class _Forwarder:
    """The embedding engine's answer, as `loadtest.fake_embeddings` gives it; counts the calls."""

    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, pool: object, upstream: bytes, path: str, started: float) -> tuple[int, bytes]:
        self.calls += 1
        return embeddings_json(orjson.loads(upstream), "embed-model")


class _Versions:
    def target(self, decision: RouteDecision, raw: Any) -> tuple[RouteDecision, object]:
        return decision, SimpleNamespace(name=decision.pool)


@dataclass
class _Parts:
    service: EmbeddingService
    lane: _Lane
    forwarder: _Forwarder
    accountant: Accountant
    ledger: MemoryLedger


def _parts(loaded: LoadedPolicy, sleeping: bool = False) -> _Parts:
    lane, forwarder, ledger = _Lane(), _Forwarder(), MemoryLedger()
    accountant = Accountant(ledger)
    serving = ServingParts(_Versions(), None, forwarder, Admission(None, None, GatewayMetrics(dict)),  # type: ignore[arg-type]
                           None, GatewayMetrics(dict), lane=lane, sleeping=lambda pool: sleeping)  # type: ignore[arg-type]
    service = EmbeddingService(PolicyHolder(loaded), serving, accountant)
    return _Parts(service, lane, forwarder, accountant, ledger)


async def _embed(service: EmbeddingService, request_id: str, batch: BatchTag | None) -> None:
    request, raw = parse_embeddings_request(b'{"model": "embed", "input": ["one two", "three"]}')
    await service.handle(request, raw, "default", request_id, batch=batch)


def test_a_batch_line_waits_in_the_lane_and_is_billed_at_the_discount_with_its_ids() -> None:
    parts = _parts(_loaded("batches: {pool_discounts: {embed: 0.25}}\n"))

    async def both() -> None:
        await _embed(parts.service, "req_line", TAG)
        await _embed(parts.service, "req_interactive", None)
        await parts.accountant.drain()  # the records are written in the background

    asyncio.run(both())
    assert parts.lane.entered == [("embed", "req_line")] and parts.lane.told == ["embed"]  # interactive: told only
    line, interactive = parts.ledger.records["req_line"], parts.ledger.records["req_interactive"]
    assert (line.batch_id, line.custom_id, line.endpoint) == ("batch_1", "line-1", "embeddings")
    assert (interactive.batch_id, interactive.custom_id) == ("", "")
    assert line.prompt_tokens == interactive.prompt_tokens == 3 and interactive.cost_micro_usd == 300
    assert line.cost_micro_usd == discounted(300, 0.25) == line.flagship_cost_micro_usd
    assert parts.forwarder.calls == 2


def test_a_batch_line_wakes_no_sleeping_embedding_pool_unless_the_policy_lets_it() -> None:
    asleep = _parts(_loaded(), sleeping=True)
    with pytest.raises(NoReplicaAvailable) as refused:
        asyncio.run(_embed(asleep.service, "req_line", TAG))
    assert refused.value.code == "pool_asleep" and asleep.forwarder.calls == 0 and asleep.lane.entered == []
    asyncio.run(_embed(asleep.service, "req_interactive", None))  # an interactive request is served (no wake here)
    assert asleep.forwarder.calls == 1
    allowed = _parts(_loaded("batches: {wake_on_demand: true}\n"), sleeping=True)
    asyncio.run(_embed(allowed.service, "req_line", TAG))
    assert allowed.forwarder.calls == 1 and allowed.lane.entered == [("embed", "req_line")]
