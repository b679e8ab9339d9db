"""The embeddings service: `/v1/embeddings` served by the policy's embedding pools (`kind: embedding`).

HTTP-free, beside the chat service and much shorter than it: an embedding request has no score, no cascade, no
ladder and no cache; it goes to the pool its `model` names. Its path: the pool (`embedding_decision`: a pool name,
alias or served name of an embedding pool, or `auto`, the tenant's one embedding pool); admission (the key's and the
tenant's rate limits on the input's estimated tokens, and the worst case of its input held against the budgets:
`Admission.admit_input`); an on-demand pool woken; the pool's engine version (its canary's share); the engine's
`/v1/embeddings` (replica failover as for any call, `gateway.serving.sending.proxy`); the engine's answer returned
as it is; and one ledger record, endpoint `embeddings`, priced per input token at the pool's `input_per_mtok`
(usage from the engine, else the input's estimate with `usage_source: estimate`). An embedding request has no
flagship counterfactual: its record's `flagship_cost_micro_usd` is its own cost (no savings claimed).

A batch line (`BatchTag`, `gateway.batches`) takes the same path, with what the chat path does for one: an on-demand
pool asleep is not woken unless the policy's `batches.wake_on_demand` allows it (503 `pool_asleep`: its worker tries
the line again later), the line waits in the batch lane for its pool's headroom once admitted, carries the policy's
`batches.engine_priority` to an engine that schedules by priority (`gateway.serving.openai.upstream.engine_body`), and
its record carries its batch id and custom_id and is priced at the pool's batch discount (its counterfactual, its own
cost, alike).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import orjson

from gateway.control.policy.policy_holder import PolicyHolder
from gateway.errors import BadRequest, ModelNotFound, NoReplicaAvailable, PermissionDenied
from gateway.serving.openai.embeddings_schema import EmbeddingsInput, EmbeddingsRequest, input_of
from gateway.serving.openai.endpoints import EMBEDDINGS
from gateway.serving.openai.upstream import engine_body
from gateway.serving.openai.usage import Usage
from gateway.serving.records.accounting import Accountant, RequestFacts
from gateway.serving.routing.request_context import BatchTag
from gateway.serving.sending.forwarding import JSONReply
from gateway.serving.serving_parts import ServingParts
from gateway.tenancy.api_keys import ApiKey
from policies.decide import AUTO_MODEL, RouteDecision, RouteStep, moved, pinned_pool, served_model
from policies.loader import LoadedPolicy
from policies.pools import context_of
from policies.schema import Policy

__all__ = ["EmbeddingService", "embedding_decision", "embedding_pools"]


def embedding_pools(policy: Policy, tenant: str) -> list[str]:
    """The embedding pools `tenant` may use (its allowed pools, else all), in policy order."""
    spec = policy.tenants.get(tenant)
    allowed = None if spec is None else spec.allowed_pools
    return [name for name, pool in policy.pools.items()
            if pool.kind == "embedding" and (allowed is None or name in allowed)]


def embedding_decision(loaded: LoadedPolicy, model: str, tenant: str) -> RouteDecision:
    """Where an embeddings request for `model` goes. Raises `ModelNotFound` (404) for a model no pool serves or a
    generative one, `PermissionDenied` (403) for an embedding pool outside the tenant's allowed pools, and
    `BadRequest` (400) for `auto` when the tenant may use several embedding pools (or 404: none)."""
    policy = loaded.policy
    usable = embedding_pools(policy, tenant)
    if model == AUTO_MODEL:
        if len(usable) != 1:
            if not usable:
                raise ModelNotFound(f"no embedding pool serves tenant {tenant!r}: model 'auto' on /v1/embeddings "
                                    "needs exactly one", param="model")
            raise BadRequest(f"model 'auto' is ambiguous on /v1/embeddings: tenant {tenant!r} may use the embedding "
                             f"pools {usable}; name one", param="model", code="model_ambiguous")
        pool, step, why = usable[0], "embedding", "the tenant's one embedding pool"
    else:
        found = pinned_pool(policy, model)
        pool, step, why = found or "", "pinned", "the requested model names it"
        if found is None or policy.pools[found].kind != "embedding":
            names = sorted({name for name, spec in policy.pools.items() if spec.kind == "embedding"} | {
                alias for alias, target in policy.aliases.items() if policy.pools[target].kind == "embedding"})
            what = "is not served here" if found is None else f"is a generative model (pool {found!r})"
            raise ModelNotFound(f"model {model!r} {what}; /v1/embeddings serves the embedding models {names} "
                                "(and 'auto')", param="model", code=None if found is None else "model_not_supported")
        if pool not in usable:
            allowed = policy.tenants[tenant].allowed_pools or ()
            raise PermissionDenied(f"tenant {tenant!r} may not use pool {pool!r}; allowed: {list(allowed)}",
                                   param="model")
    return RouteDecision(pool, served_model(policy, pool), None, step, f"{why}: {pool!r}", loaded.version,
                         route=(RouteStep(step, pool, why),))


class EmbeddingService:
    """Handles one embeddings request end to end. Shares, does not own, its collaborators: the chat service's
    `parts` (`gateway.serving.serving_parts`: the versions, forwarder, admission, wake, and for batch lines the lane
    and `sleeping`), and the accountant that records its cost."""

    def __init__(self, policies: PolicyHolder, parts: ServingParts, accountant: Accountant) -> None:
        self._policies = policies
        self._versions, self._forwarder, self._admission = parts.versions, parts.forwarder, parts.admission
        self._wake, self._lane, self._sleeping = parts.wake, parts.lane, parts.sleeping
        self._accountant = accountant

    async def handle(self, request: EmbeddingsRequest, raw: Mapping[str, Any], tenant: str, request_id: str,
                     key: ApiKey | None = None, batch: BatchTag | None = None) -> JSONReply:
        """The engine's answer to `raw` (the client's body, `model` rewritten to the pool's), its cost recorded.
        Raises the errors of `embedding_decision`, admission's 429 and 503, and the engine's (4xx as its own, else
        502; 503 when no replica is up). `batch`: the batch line the request is (see the module docstring; the lane
        holds its place until its caller tells the lane the line ended)."""
        started, started_wall = time.monotonic(), time.time()
        loaded = self._policies.current
        decision = embedding_decision(loaded, request.model, tenant)
        size = input_of(request)
        held = size.held(context_of(loaded.policy.pools[decision.pool]))
        async with self._admission.refunds(request_id):  # refused after admission: its limits and hold go back
            await self._admission.admit_input(loaded.policy, tenant, decision.pool, size.tokens, held, request_id,
                                              key)
            decision = await self._woken(loaded.policy, tenant, decision, batch)
            if batch is not None and self._lane is not None:
                await self._lane.enter(loaded, decision.pool, request_id)
            elif self._lane is not None:  # interactive: it may take the pool back from its lines (`batches.preempt`)
                await self._lane.arrived(loaded, decision.pool)
            decision, pool = self._versions.target(decision, raw)
            upstream = orjson.dumps(engine_body({**raw, "model": decision.model}, loaded.policy, decision,
                                                batch is not None))
            _, body = await self._forwarder.complete(pool, upstream, EMBEDDINGS.path, started)
        facts = RequestFacts(request_id, tenant, decision, started_wall, started, None, "ok",
                             endpoint=EMBEDDINGS.name, key_id=key.id if key is not None else "",
                             batch_id=batch.batch_id if batch else "", custom_id=batch.custom_id if batch else "")
        rec = self._accountant.cost_record(loaded.policy, facts, _usage(body, size))
        self._accountant.spawn(self._accountant.record_priced(replace(rec, flagship_cost_micro_usd=rec.cost_micro_usd)))
        return JSONReply(body, decision)

    async def _woken(self, policy: Policy, tenant: str, decision: RouteDecision,
                     batch: BatchTag | None) -> RouteDecision:
        """An on-demand pool woken (or its cold fallback, an embedding pool the tenant may use, meanwhile); for a
        batch line, only where the policy's `batches.wake_on_demand` allows it."""
        if batch is not None and not policy.batches.wake_on_demand and self._sleeping is not None \
                and self._sleeping(decision.pool):
            raise NoReplicaAvailable(f"pool {decision.pool!r} is scaled to zero and batch lines do not wake it "
                                     "(policy batches.wake_on_demand)", code="pool_asleep")
        if self._wake is None:
            return decision
        usable = embedding_pools(policy, tenant)
        target = await self._wake(decision.pool, usable.__contains__)
        if target == decision.pool:
            return decision
        why = f"{decision.pool!r} is starting on demand"
        return moved(policy, decision, "on-demand-fallback", target, why, f"{why}: served by {target!r} meanwhile")


def _usage(body: bytes, size: EmbeddingsInput) -> Usage:
    """The input tokens the engine reports (`usage.prompt_tokens`), else the input's estimate."""
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        answer = None
    usage = answer.get("usage") if isinstance(answer, dict) else None
    prompt = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    if type(prompt) is int and prompt >= 0:
        return Usage(prompt, 0, "engine")
    return Usage(size.tokens, 0, "estimate")
