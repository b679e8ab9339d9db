"""The response cache on the request path: one lookup after routing, one keep when the answer is whole.

`AnswerCache.lookup` runs once the router chose the pool and model, before anything is forwarded. It answers a
`CacheLookup`: a hit carries the reply (JSON, or an SSE stream when the client streams) and records it in the
ledger at cost 0 (status "cache_hit", its avoided cost what the answering pool would have charged); a miss or a
bypass carries nothing, and `keep(reply)` marks the engine's reply (`x-cascade-cache`) and, for a miss, keeps its
answer once it is whole (a JSON body at once, a stream when it finished completely), off the response path.

Never fails a request: Redis down or slow is a bypass, a cache entry that does not parse is dropped and the
request served fresh (both counted in `cascade_cache_failures_total`). Which requests are eligible, and how they
are keyed: `gateway.caching.keys`; the modes: `policies.cache`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass, replace
from typing import Any

import orjson

from gateway.caching.entry import CacheEntry, CorruptEntry, decode, encode, entry_of
from gateway.caching.keys import (
    CacheKeys,
    bypass_reason,
    context_digest,
    exact_digest,
    latest_user_text,
    reads_whole,
)
from gateway.caching.replies import answer_body, stream_relay
from gateway.caching.store import CacheUnavailable, RedisCacheStore
from gateway.caching.vectors import encode_row, nearest, quantise
from gateway.checking.judge import CHECK_HEADER
from gateway.serving.openai.schema import ChatRequest
from gateway.serving.openai.usage import Usage, usage_from_json
from gateway.serving.records.accounting import Accountant, RequestFacts
from gateway.serving.routing.router import RequestRouter
from gateway.serving.sending.assemble import assemble_events
from gateway.serving.sending.forwarding import JSONReply, StreamReply
from gateway.serving.sending.streaming import StreamRelay
from gateway.telemetry.metrics import GatewayMetrics
from policies.cache import ResponseCache
from policies.schema import Policy

__all__ = ["CACHE_HEADER", "AnswerCache", "CacheLookup", "lookup_answer"]

log = logging.getLogger("cascade.cache")

CACHE_HEADER = "x-cascade-cache"
SIMILARITY_HEADER = "x-cascade-cache-similarity"
_NOT_KEPT = ("x-cascade-truncated",)  # the ladder changed the request: its answer is not this request's


@dataclass(frozen=True, slots=True)
class _Slot:
    """Where a miss's answer goes: the entry key, and the exact digest or the semantic row."""

    key: str
    digest: str = ""
    vectors: str = ""
    entry_id: str = ""
    row: bytes = b""


@dataclass(frozen=True, slots=True, eq=False)
class CacheLookup:
    """The cache's answer for one request. `result`: "hit", "miss", "bypass", or "" (the tenant has no cache);
    `reply`: a hit's answer. A miss names where its answer goes (the cache, the tenant's spec, the slot)."""

    _cache: AnswerCache | None
    result: str
    _facts: RequestFacts
    _spec: ResponseCache | None = None
    _slot: _Slot | None = None
    reply: JSONReply | StreamReply | None = None

    @property
    def tenant(self) -> str:
        return self._facts.tenant

    def facts(self, facts: RequestFacts) -> RequestFacts:
        """`facts` of the engine's answer, carrying the result to its ledger record."""
        return replace(facts, cache=self.result) if self.result else facts

    def keep(self, reply: JSONReply | StreamReply) -> JSONReply | StreamReply:
        """`reply` (an engine's) marked with the result; a miss's answer is kept once whole."""
        if not self.result:
            return reply
        if self._cache is not None and self._spec is not None and self._slot is not None:
            self._cache.keep_later(self._facts.tenant, self._spec, self._slot, reply)
        return replace(reply, headers={**reply.headers, CACHE_HEADER: self.result})


class AnswerCache:
    """Shares, does not own, its collaborators. `store` None (no Redis): every eligible request is bypassed."""

    def __init__(self, store: RedisCacheStore | None, keys: CacheKeys, router: RequestRouter,
                 accountant: Accountant, metrics: GatewayMetrics) -> None:
        self._store = store
        self._keys = keys
        self._router = router
        self._accountant = accountant
        self._metrics = metrics

    async def lookup(self, policy: Policy, facts: RequestFacts, request: ChatRequest,
                     raw: dict[str, Any]) -> CacheLookup:
        tenant = policy.tenants.get(facts.tenant)
        spec = tenant.cache if tenant is not None else None
        if spec is None:
            return CacheLookup(None, "", facts)
        if bypass_reason(raw) is not None:
            return self._counted(CacheLookup(self, "bypass", facts), spec)
        found: tuple[CacheEntry, float | None] | _Slot | None
        try:
            if spec.mode == "exact":
                found = await self._exact(policy, facts, raw, spec)
            else:
                found = await self._semantic(policy, facts, raw, spec)
        except CacheUnavailable:
            self._fail(facts.tenant, spec, "unavailable")
            return self._counted(CacheLookup(self, "bypass", facts), spec)
        if isinstance(found, _Slot):
            return self._counted(CacheLookup(self, "miss", facts, spec, found), spec)
        if found is None:
            return self._counted(CacheLookup(self, "bypass", facts), spec)
        entry, similarity = found
        return self._counted(CacheLookup(self, "hit", facts, spec, reply=self._hit(policy, facts, request, entry,
                                                                                   similarity)), spec)

    def _counted(self, lookup: CacheLookup, spec: ResponseCache) -> CacheLookup:
        self._metrics.cache_lookups.labels(lookup.tenant, spec.mode, lookup.result).inc()
        return lookup

    def _fail(self, tenant: str, spec: ResponseCache, reason: str) -> None:
        self._metrics.cache_failures.labels(tenant, spec.mode, reason).inc()

    async def _exact(self, policy: Policy, facts: RequestFacts, raw: dict[str, Any],
                     spec: ResponseCache) -> tuple[CacheEntry, float | None] | _Slot:
        digest = exact_digest(facts.decision.model, raw)
        key = self._keys.exact(facts.tenant, digest)
        entry = await self._read(policy, facts.tenant, spec, key)
        return (entry, None) if entry is not None else _Slot(key, digest=digest)

    async def _semantic(self, policy: Policy, facts: RequestFacts, raw: dict[str, Any],
                        spec: ResponseCache) -> tuple[CacheEntry, float] | _Slot | None:
        text = latest_user_text(raw)
        embedded = self._router.embedding(raw)
        if embedded is None:
            self._fail(facts.tenant, spec, "no_embedding")
            return None
        space, vector = embedded
        if text is None or not reads_whole(space, text):
            return None  # not plain text, or longer than the embedder reads: any text with its start would match
        model, query = facts.decision.model, quantise(vector)
        context = context_digest(model, raw)
        vectors = self._keys.vectors(facts.tenant, model, space)
        store = self._need_store()
        now = time.time()
        best, bad = nearest(await store.rows(vectors), query, context, now - spec.ttl_s)
        if bad:
            self._fail(facts.tenant, spec, "corrupt_entry")
        if best is not None and spec.min_similarity is not None and best.similarity >= spec.min_similarity:
            key = self._keys.semantic(facts.tenant, best.field.decode())
            entry = await self._read(policy, facts.tenant, spec, key, vectors, best.field)
            if entry is not None:
                return entry, best.similarity
        entry_id = f"{time.time_ns():016x}{os.urandom(4).hex()}"  # sorts by store time: the bound drops the oldest
        return _Slot(self._keys.semantic(facts.tenant, entry_id), vectors=vectors, entry_id=entry_id,
                     row=encode_row(context, now, query))

    def _need_store(self) -> RedisCacheStore:
        if self._store is None:
            raise CacheUnavailable
        return self._store

    async def _read(self, policy: Policy, tenant: str, spec: ResponseCache, key: str, vectors: str | None = None,
                    field: bytes | None = None) -> CacheEntry | None:
        """The entry under `key`; None when absent, corrupt (dropped, counted) or from a pool no longer served."""
        store = self._need_store()
        raw = await store.get(key)
        if raw is None:
            if vectors is not None:  # the row outlived its entry
                self._accountant.spawn(self._quietly(store.drop(key, vectors, field)))
            return None
        try:
            entry = decode(raw)
        except CorruptEntry as exc:
            log.warning("response cache: dropped a corrupt entry of tenant %s (%s)", tenant, exc)
            self._fail(tenant, spec, "corrupt_entry")
            self._accountant.spawn(self._quietly(store.drop(key, vectors, field)))
            return None
        return entry if entry.pool in policy.pools else None

    @staticmethod
    async def _quietly(work: Any) -> None:
        with contextlib.suppress(CacheUnavailable):
            await work

    # ------------------------------------------------------------------------------------------------ hits

    def _hit(self, policy: Policy, facts: RequestFacts, request: ChatRequest, entry: CacheEntry,
             similarity: float | None) -> JSONReply | StreamReply:
        why = "an exact repeat" if similarity is None else f"a similar request ({similarity:.4f})"
        # no engine answered: no engine version
        decision = facts.decision.then("cache", f"answered from the tenant's cache: {why}", pool=entry.pool,
                                       model=entry.model, pool_version="")
        facts = replace(facts, decision=decision)
        headers = {CACHE_HEADER: "hit"}
        if similarity is not None:
            headers[SIMILARITY_HEADER] = f"{similarity:.4f}"
        body = answer_body(entry, facts.request_id)
        if not request.stream:
            self._accountant.spawn(self._record_hit(policy, facts, entry.usage, None))
            return JSONReply(orjson.dumps(body), decision, headers)

        def on_finish(relay: StreamRelay) -> None:
            self._accountant.spawn(self._record_hit(policy, facts, entry.usage, relay.ttft_s))

        return StreamReply(stream_relay(body, request.wants_usage_chunk, facts.started, on_finish), decision, headers)

    async def _record_hit(self, policy: Policy, facts: RequestFacts, usage: Usage, ttft_s: float | None) -> None:
        """Cost 0; `cache_avoided_micro_usd` the pool's price of the answer's tokens; the flagship counterfactual as
        for any answer, so the hit's whole counterfactual counts in the savings."""
        priced = self._accountant.cost_record(policy, replace(facts, ttft_s=ttft_s, cache="hit"), usage)
        rec = replace(priced, cost_micro_usd=0, cache_avoided_micro_usd=priced.cost_micro_usd, status="cache_hit")
        await self._accountant.record_priced(rec)

    # ------------------------------------------------------------------------------------------------ keep

    def keep_later(self, tenant: str, spec: ResponseCache, slot: _Slot, reply: JSONReply | StreamReply) -> None:
        """Keep `reply`'s answer under `slot` once it is whole; one that an output check failed (its header says
        so; a stream's verdict is on its relay when it ends), or that answers a request the ladder changed, is not
        kept."""
        if any(h in reply.headers for h in _NOT_KEPT) or "=fail" in reply.headers.get(CHECK_HEADER, ""):
            return
        pool, model = reply.decision.pool, reply.decision.model
        if isinstance(reply, JSONReply):
            try:
                body = orjson.loads(reply.body)
            except orjson.JSONDecodeError:
                return
            if isinstance(body, dict):
                self._keep(tenant, spec, slot, entry_of(pool, model, body, usage_from_json(body)))
            return

        def on_finish(relay: StreamRelay) -> None:
            if not relay.completed or relay.error is not None or relay.usage is None:
                return
            body = assemble_events(relay.events).answer()
            if relay.output_check.startswith("fail"):  # the output checks' verdict (`Forwarder.relay`)
                return
            body["usage"] = {"prompt_tokens": relay.usage.prompt_tokens,
                             "completion_tokens": relay.usage.completion_tokens,
                             "total_tokens": relay.usage.prompt_tokens + relay.usage.completion_tokens}
            self._keep(tenant, spec, slot, entry_of(pool, model, body, relay.usage))

        reply.relay.add_finish_callback(on_finish)

    def _keep(self, tenant: str, spec: ResponseCache, slot: _Slot, entry: CacheEntry | None) -> None:
        if entry is None or self._store is None:
            return
        self._accountant.spawn(self._write(tenant, spec, slot, entry, self._store))

    async def _write(self, tenant: str, spec: ResponseCache, slot: _Slot, entry: CacheEntry,
                     store: RedisCacheStore) -> None:
        try:
            if slot.digest:
                await store.keep_exact(slot.key, self._keys.exact_index(tenant), slot.digest, encode(entry),
                                       spec.ttl_s, spec.entries, self._keys.exact_prefix(tenant))
            else:
                await store.keep_semantic(slot.vectors, slot.key, slot.entry_id, slot.row, encode(entry), spec.ttl_s,
                                          spec.entries, self._keys.semantic_prefix(tenant))
        except CacheUnavailable:
            self._fail(tenant, spec, "unavailable")


async def lookup_answer(cache: AnswerCache | None, policy: Policy, facts: RequestFacts, request: ChatRequest,
                        raw: dict[str, Any]) -> CacheLookup:
    """`cache.lookup(...)`, or the lookup of a gateway without a response cache (nothing found, nothing kept)."""
    if cache is None:
        return CacheLookup(None, "", facts)
    return await cache.lookup(policy, facts, request, raw)
