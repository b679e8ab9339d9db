"""Decide where a request goes: shed check, complexity score (only when it decides), policy decision.

HTTP-free. Scoring failures never fail a request: it is routed without a score and the reason says so.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gateway.control.adaptation.live_threshold import LiveThreshold
from gateway.control.adaptation.live_tradeoff import LiveTradeoff
from gateway.errors import ModelNotFound, PermissionDenied, TooManyRequests
from gateway.serving.openai.schema import ChatRequest
from gateway.serving.routing.drift import DomainDrift
from gateway.serving.routing.label_memories import LabelMemories, MemoryScore
from gateway.serving.routing.tier_trade import QualityModel, map_of, tier_estimates
from gateway.telemetry.metrics import GatewayMetrics
from policies.decide import (
    AUTO_MODEL,
    EmbeddingModel,
    ModelNotRouted,
    PoolNotAllowed,
    RouteContext,
    RouteDecision,
    RouteStep,
    decide,
    known_model,
    needs_score,
    rule_models,
    served_model,
    thresholds_in_use,
)
from policies.ladder import LadderState
from policies.loader import LoadedPolicy
from policies.threshold import base_threshold
from policies.tiers import TierEstimate, Trade
from router_models.embedders.protocol import FloatArray
from router_models.serving.scorer import (
    ConversationShape,
    Scorer,
    ScorerViews,
    conversation_text,
    read_conversation,
)

__all__ = ["RequestRouter"]

log = logging.getLogger("cascade.router")
_Conversation = tuple[str, ConversationShape]  # a request's scoring text and its shape, as the scorer read them


class RequestRouter:
    """Routes requests under a given policy and ladder state. Shares, does not own, the scorer and the live
    threshold (a `flagship_share` policy's routing threshold, fed with each decision)."""

    def __init__(self, scorer: Scorer | None, metrics: GatewayMetrics, live: LiveThreshold | None = None,
                 memories: LabelMemories | None = None, tradeoff: LiveTradeoff | None = None) -> None:
        """`tradeoff`: a `routing.tiers` policy's tradeoff (the live one of a `cost_per_1k` policy), fed with each
        trade; None: the policy's own `tradeoff` (0 without one)."""
        self._scorer = scorer
        self._views = ScorerViews.of(scorer)  # the scorer as its protocols, checked once per scorer
        self._metrics = metrics
        self._live = live
        self.memories = memories
        self.drift = DomainDrift()  # tenants drifting from the training data (policy learning.in_domain)
        self.tradeoff = tradeoff
        self.pool_map: QualityModel | None = map_of(scorer)  # a tiers policy's quality per tier (`tier_trade`)

    @property
    def scorer(self) -> Scorer | None:
        return self._scorer

    def embedding(self, raw: Mapping[str, Any]) -> tuple[str, FloatArray] | None:
        """(vector space, vector) of the router's own embedding of this request's text, as its scorer computed it
        when it routed the request; None when there is none (not scored, scored by the overflow model, a scorer
        that keeps no embeddings). Nothing is embedded here: the response cache's semantic mode reads it."""
        scorer = self._views.embedding
        if scorer is None or not scorer.embedding_space:
            return None
        vector = scorer.embedding(conversation_text(raw["messages"]))
        return None if vector is None else (scorer.embedding_space, vector)

    def use_scorer(self, scorer: Scorer) -> None:
        """Score the next requests with `scorer` (a hot router swap); a request being scored finishes on the
        one it started with. The caller closes the old scorer once nothing uses it."""
        self._scorer = scorer
        self._views = ScorerViews.of(scorer)
        self.pool_map = map_of(scorer)

    async def _score(self, raw: Mapping[str, Any]) -> tuple[float | None, str, str, _Conversation | None]:
        """The score of the conversation, the model that gave it, its version, and the conversation as scored (its
        scoring text and its shape: turns, whole length; read once, for what the scorer kept of it); (None, "", "",
        None) when scoring failed."""
        scorer = self._scorer
        assert scorer is not None
        began = time.monotonic()
        try:
            conversation = read_conversation(raw["messages"])
            score, scored_by = await scorer.score_one(*conversation)
        except Exception:
            log.exception("scoring failed; routing without a score")
            return None, "", "", None
        self._metrics.scoring.observe(time.monotonic() - began)
        return score, scored_by, scorer.version, conversation

    async def _remembered(self, loaded: LoadedPolicy, tenant: str, conversation: _Conversation,
                          score: float) -> MemoryScore | None:
        """The primary model's score of `conversation` moved by the label memory the policy gives this tenant
        (`learning.label_memory.scope`), with the memory's name, labels and move of the predicted gap
        (`MemoryScore`); None when there is none or it could not move the score."""
        scope = loaded.policy.learning.label_memory.scope
        if scope == "none" or self.memories is None:
            return None
        text, shape = conversation
        try:
            return await self.memories.adjust_off_loop(tenant if scope == "tenant" else "shared", self._views, text,
                                                       score, shape)
        except Exception:  # the memory could not move it: the router's own score routes
            log.exception("label memory did not move the score; routing on the router's")
            return None

    async def _trade(self, loaded: LoadedPolicy, ctx: RouteContext, conversation: _Conversation | None,
                     memory: MemoryScore | None = None) -> Trade | None:
        """Every tier's prediction for a request the primary model scored (`gateway.serving.routing.tier_trade`), moved
        by its label memory (`_memory_moved`), and the tradeoff in force; None without tiers, a pool map or the
        request's feature row."""
        policy = loaded.policy
        source = self._views.features
        if not policy.routing.tiers or self.pool_map is None or source is None or conversation is None:
            return None
        row = source.features(*conversation)
        estimates = None if row is None else tier_estimates(loaded, ctx, self.pool_map, row)
        if estimates is None or row is None:
            return None
        label = ""
        if memory is not None:
            estimates = await self._memory_moved(loaded, estimates, row, memory)
            label = f"{memory.name}@{memory.labels}"
        if self.tradeoff is None:
            return Trade(estimates, policy.routing.tradeoff or 0.0, label)
        self.tradeoff.observe(policy, estimates)
        return Trade(estimates, self.tradeoff.tradeoff(policy, estimates), label)

    async def _memory_moved(self, loaded: LoadedPolicy, estimates: tuple[TierEstimate, ...], row: FloatArray,
                            memory: MemoryScore) -> tuple[TierEstimate, ...]:
        """`estimates` moved by `memory` (`LabelMemories.move_tiers`: by its labels per pool, or its gap move for a
        memory without them). A move that fails is logged and the estimates are kept."""
        assert self.memories is not None and self.pool_map is not None  # a MemoryScore came from them
        placements = tuple(loaded.placements[e.pool] for e in estimates)
        try:
            return await self.memories.move_tiers(memory, estimates, row, placements, self.pool_map)
        except Exception:
            log.exception("label memory %s did not move the tiers; trading on the map's predictions", memory.name)
            return estimates

    def _in_domain(self, text: str) -> float | None:
        """The in-domain figure the scorer kept for this scoring text (None: it keeps none)."""
        domain = self._views.domain
        return None if domain is None else domain.in_domain(text)

    def _held(self, loaded: LoadedPolicy, ctx: RouteContext, ladder: LadderState, threshold: float | None,
              decision: RouteDecision) -> RouteDecision:
        """`decision` at the safer threshold of `learning.in_domain.hold` when its tenant drifts and its own label
        memory holds fewer than `until_labels` labels: decided again at that threshold (so allowed pools, rules and
        the ladder apply as to any decision), with a `domain-hold` step when the pool changed. Unchanged
        otherwise, or when the threshold in force is already as low."""
        hold = loaded.policy.learning.in_domain.hold
        if hold is None or decision.score is None or decision.rule == "trade" or not self.drift.drifting(ctx.tenant):
            return decision
        labels = self.memories.labels(ctx.tenant) if self.memories is not None else 0
        usual = threshold if threshold is not None else base_threshold(loaded.policy.routing.threshold)
        if labels >= hold.until_labels or hold.threshold >= usual:
            return decision
        safer = decide(loaded.policy, loaded.version, ctx, decision.score, ladder, hold.threshold)
        if safer.pool == decision.pool:
            return decision
        why = (f"tenant drifts from the training data; threshold held at {hold.threshold} until {hold.until_labels} "
               f"own labels ({labels} so far)")
        return replace(decision, pool=safer.pool, model=safer.model, rule="domain-hold",
                       reason=f"{safer.reason}; {why}", route=(*decision.route, RouteStep("domain-hold", safer.pool,
                                                                                         why)))

    async def route(
        self, request: ChatRequest, raw: Mapping[str, Any], tenant: str, headers: Mapping[str, str],
        loaded: LoadedPolicy, ladder: LadderState, downgrade: bool = False,
    ) -> RouteDecision:
        """Raises ModelNotFound (404), PermissionDenied (403), TooManyRequests (429, shed by the ladder: a
        `scope: all` shed step before scoring, a `scope: pool` one when the request is routed to its pool)."""
        policy = loaded.policy
        if not known_model(policy, request.model):
            names = sorted({AUTO_MODEL, *policy.pools, *policy.aliases, *rule_models(policy)})
            raise ModelNotFound(f"model {request.model!r} is not served here; use one of {names}", param="model")
        priority = _priority(loaded, tenant)
        _shed(ladder.applying_to(None), priority)  # `scope: all` steps, before the score is spent
        ctx = RouteContext.from_request(raw, tenant, headers)
        threshold = self._live.threshold(policy) if self._live is not None else None
        if self._views.refine is not None:  # a two-stage scorer refines the scores near the thresholds in use
            self._views.refine.refine_near(*thresholds_in_use(policy, threshold, ladder))
        score, scored_by, version, conversation = (await self._score(raw) if self._scorer is not None
                                                   and needs_score(policy, ctx) else (None, "", "", None))
        in_domain, trade = None, None
        if score is not None and scored_by == "primary" and conversation is not None:
            in_domain = self._in_domain(conversation[0])
            self.drift.observe(policy.learning.in_domain, tenant, in_domain)
            memory = await self._remembered(loaded, tenant, conversation, score)
            if memory is not None:
                score, version = memory.score, memory.version(version)
            trade = await self._trade(loaded, ctx, conversation, memory)
        try:
            decision = replace(decide(policy, loaded.version, ctx, score, ladder, threshold, trade),
                               scored_by=scored_by, router_version=version, in_domain=in_domain)
            decision = self._held(loaded, ctx, ladder, threshold, decision)
        except PoolNotAllowed as exc:
            raise PermissionDenied(str(exc), param="model") from exc
        except ModelNotRouted as exc:
            raise ModelNotFound(str(exc), param="model") from exc
        except EmbeddingModel as exc:
            raise ModelNotFound(f"{exc}; send it to /v1/embeddings", param="model", code="model_not_supported") from exc
        if self._live is not None:
            self._live.observe(policy, ctx, decision)
        micro = policy.routing.micro_pool
        if downgrade and decision.pool != micro:
            reason = f"tenant {tenant!r} is over budget (policy: downgrade); {decision.reason}"
            decision = decision.then("budget-downgrade", "the tenant is over budget (policy: downgrade)", pool=micro,
                                     model=served_model(policy, micro), rule="budget-downgrade", reason=reason)
        _shed(ladder.applying_to(decision.pool), priority)
        return decision


def _priority(loaded: LoadedPolicy, tenant: str) -> int:
    spec = loaded.policy.tenants.get(tenant)
    return spec.priority if spec is not None else 0


def _shed(ladder: LadderState, priority: int) -> None:
    """Raise TooManyRequests (429 with Retry-After) when `ladder` (already narrowed to the request's pool)
    sheds a tenant of this priority."""
    retry = ladder.shed_retry_after(priority)
    if retry is not None:
        raise TooManyRequests(f"the gateway is shedding load ({', '.join(ladder.names)}); retry in {retry} s",
                              retry, type_="overloaded", code="load_shed")
