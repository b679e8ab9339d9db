"""The second validation phase: cross-references and logic that a schema cannot express.

`reference_problems(policy)` returns ``(yaml_path, message)`` pairs; the loader adds file and line.
Every message says what is wrong and how to fix it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from policies.batches import PRIORITY_SCHEDULING, priority_engines
from policies.ladder_schema import FRACTION_SIGNALS, FallbackPool, LadderStep, Overflow, RaiseThreshold
from policies.output_checks import resolve
from policies.pools import context_of, is_embedding
from policies.rules import RuleMatch
from policies.schema import Policy, RemotePool
from policies.threshold import base_threshold
from policies.tiers import tier_problems

__all__ = ["Loc", "Problem", "reference_problems"]

Loc = tuple[int | str, ...]
Problem = tuple[Loc, str]
_SHA256 = re.compile(r"[0-9a-f]{64}")


def _unknown_pool(policy: Policy, name: str | None, loc: Loc) -> Iterator[Problem]:
    if name is not None and name not in policy.pools:
        yield loc, f"unknown pool {name!r}; defined pools: {sorted(policy.pools)} (fix the name or define the pool)"


def _empty_ranges(match: RuleMatch, loc: Loc) -> Iterator[Problem]:
    for low, high in (("min_prompt_chars", "max_prompt_chars"), ("min_prompt_tokens", "max_prompt_tokens"),
                      ("min_score", "max_score")):
        lo, hi = getattr(match, low), getattr(match, high)
        if lo is not None and hi is not None and lo > hi:
            yield (*loc, "match", low), f"{low} {lo} > {high} {hi}: the rule can never match; swap them"


def _rule_problems(policy: Policy) -> Iterator[Problem]:
    if not policy.routing.tiers:  # else they are tiers, checked there (`policies.tiers.tier_problems`)
        yield from _unknown_pool(policy, policy.routing.micro_pool, ("routing", "micro_pool"))
        yield from _unknown_pool(policy, policy.routing.flagship_pool, ("routing", "flagship_pool"))
    seen: set[str] = set()
    catch_all: str | None = None
    for i, rule in enumerate(policy.routing.rules):
        loc: Loc = ("routing", "rules", i)
        if rule.name in seen:
            yield (*loc, "name"), f"duplicate rule name {rule.name!r}; names must be unique (rename one)"
        seen.add(rule.name)
        if catch_all is not None:
            yield loc, (f"rule {rule.name!r} is unreachable: rule {catch_all!r} before it has an empty `match` "
                        "and matches everything; move the catch-all last or give it conditions")
        if rule.match.is_catch_all:
            catch_all = rule.name
        yield from _unknown_pool(policy, rule.pool, (*loc, "pool"))
        if (rule.pool is None) == (rule.threshold is None):
            yield loc, "give exactly one of `pool` or `threshold`"
        yield from _empty_ranges(rule.match, loc)


def _tenant_problems(policy: Policy) -> Iterator[Problem]:
    owners: dict[str, str] = {}
    for name, tenant in policy.tenants.items():
        loc: Loc = ("tenants", name)
        if tenant.allowed_pools is not None and not tenant.allowed_pools:
            yield (*loc, "allowed_pools"), "empty allowed_pools would refuse every request; list pools or remove it"
        for j, pool in enumerate(tenant.allowed_pools or ()):
            yield from _unknown_pool(policy, pool, (*loc, "allowed_pools", j))
        for j, digest in enumerate(tenant.api_key_sha256):
            where = (*loc, "api_key_sha256", j)
            if not _SHA256.fullmatch(digest):
                yield where, "not a lower-case hex SHA-256 (64 chars): use `printf %s KEY | sha256sum`"
            elif digest in owners:
                yield where, f"the same key hash is already tenant {owners[digest]!r}'s; a key has one tenant"
            owners.setdefault(digest, name)
    for alias, pool in policy.aliases.items():
        yield from _unknown_pool(policy, pool, ("aliases", alias))
        if alias == "auto" or alias in policy.pools:
            yield ("aliases", alias), "alias shadows a pool name or 'auto'; rename it"


def _step_problems(policy: Policy, step: LadderStep, loc: Loc) -> Iterator[Problem]:
    yield from _unknown_pool(policy, step.pool, (*loc, "pool"))
    if step.exit_below >= step.enter_above:
        yield (*loc, "exit_below"), (f"exit_below {step.exit_below} must be < enter_above {step.enter_above} "
                                     "(hysteresis keeps the step from flapping); lower it")
    if step.signal in FRACTION_SIGNALS and step.enter_above > 1:
        yield (*loc, "enter_above"), f"{step.signal} is a fraction 0..1; {step.enter_above} is never reached"
    action = step.action
    base = base_threshold(policy.routing.threshold)  # a share form is checked against its `initial`
    if isinstance(action, RaiseThreshold) and action.threshold <= base:
        yield (*loc, "action", "threshold"), (f"raise_threshold {action.threshold} is not above routing.threshold "
                                              f"{base}; use a higher value")
    if step.remap is not None:
        source, target = step.remap
        yield from _unknown_pool(policy, source, (*loc, "action", "from_pool"))
        yield from _unknown_pool(policy, target, (*loc, "action", "to_pool"))
        if source == target:
            yield (*loc, "action", "to_pool"), f"to_pool is the pool it replaces ({source!r}); name another pool"
        if isinstance(action, Overflow) and not isinstance(policy.pools.get(target), RemotePool | None):
            msg = f"overflow goes to a remote pool; {target!r} is local (use fallback_pool)"
            yield (*loc, "action", "to_pool"), msg
        if isinstance(action, FallbackPool) and action.max_json_failure_rate is not None:
            pool = policy.pools.get(target)
            actions, _ = resolve((getattr(pool, "output_checks", None), policy.output_checks))
            if "json" not in actions:
                yield (*loc, "action", "max_json_failure_rate"), (
                    f"nothing measures {target!r}'s JSON failures: turn the json output check on for it "
                    f"(output_checks: {{json: flag}} at the top level or on pool {target!r})")


def _ladder_problems(policy: Policy) -> Iterator[Problem]:
    names: set[str] = set()
    edges: dict[str, str] = {}
    for i, step in enumerate(policy.degradation.steps):
        loc: Loc = ("degradation", "steps", i)
        if step.name in names:
            yield (*loc, "name"), f"duplicate step name {step.name!r}; names must be unique (rename one)"
        names.add(step.name)
        yield from _step_problems(policy, step, loc)
        if step.remap is not None and step.remap[0] != step.remap[1]:
            edges.setdefault(*step.remap)
            pool, seen = step.remap[1], {step.remap[0]}
            while pool in edges and pool not in seen:
                seen.add(pool)
                pool = edges[pool]
            if pool in seen:
                yield (*loc, "action"), f"pool moves form a cycle through {sorted(seen)}; break the cycle"


def _on_demand_problems(policy: Policy) -> Iterator[Problem]:
    for name, pool in policy.pools.items():
        fallback = getattr(getattr(pool, "on_demand", None), "fallback_pool", None)
        if fallback is None:
            continue
        loc: Loc = ("pools", name, "on_demand", "on_cold")
        yield from _unknown_pool(policy, fallback, loc)
        if fallback == name:
            yield loc, "a pool cannot fall back to itself while cold; name another pool or use 'wait'"


def _learning_problems(policy: Policy) -> Iterator[Problem]:
    learning = policy.learning
    shadow, loc = learning.shadow, ("learning", "shadow")
    yield from _unknown_pool(policy, shadow.flagship_pool, (*loc, "flagship_pool"))
    yield from _unknown_pool(policy, shadow.judge_pool, (*loc, "judge_pool"))
    if shadow.sample > 0 and shadow.judge_pool is None:
        yield (*loc, "judge_pool"), "shadow comparisons need a judge: name the pool that judges the two answers"
    if shadow.both_orders and shadow.judge_pool is None:
        yield (*loc, "both_orders"), "both_orders judges with the judge pool, and none is named: set judge_pool"
    if shadow.sample > 0 and learning.keep_prompts.sample == 0:
        yield (*loc, "sample"), ("shadow compares kept requests only, and learning.keep_prompts.sample is 0: "
                                 "keep a share of prompts or set shadow.sample to 0")
    if learning.retrain.every_hours > 0 and learning.keep_prompts.sample == 0:
        yield ("learning", "retrain", "every_hours"), (
            "retraining learns from kept requests only, and learning.keep_prompts.sample is 0: keep a share of "
            "prompts or set retrain.every_hours to 0")
    if learning.in_domain.hold is not None and learning.label_memory.scope != "tenant":
        yield ("learning", "in_domain", "hold"), (
            "hold waits for the drifting tenant's own labels, which move its scores only with "
            "learning.label_memory.scope: tenant; set that scope or remove hold")


def _autoscale_problems(policy: Policy) -> Iterator[Problem]:
    """Growing comes before shedding: an autoscale bound at or above a ladder step's `enter_above` on the same
    pool and signal would let the ladder degrade traffic before the pool grows."""
    for i, step in enumerate(policy.degradation.steps):
        spec = policy.pools.get(step.pool)
        scale = getattr(spec, "autoscale", None)
        bound = None if scale is None else scale.scale_up.bounds().get(step.signal)
        if bound is not None and bound >= step.enter_above:
            yield (("pools", step.pool, "autoscale", "scale_up", step.signal),
                   f"{step.signal} {bound:g} is not below ladder step {step.name!r}'s enter_above "
                   f"{step.enter_above:g} (degradation.steps[{i}]): the pool would degrade traffic before it "
                   "grows; lower the autoscale bound or raise the step's")


def _limit_problems(policy: Policy) -> Iterator[Problem]:
    """A default completion limit leaves room for a prompt in every pool whose context is known."""
    limit = policy.default_max_tokens
    if limit is None:
        return
    for name, spec in policy.pools.items():
        context = context_of(spec)
        if context is not None and limit >= context:
            yield (("default_max_tokens",), f"{limit} does not fit pool {name!r}, whose context holds {context} "
                   "tokens (prompt and completion together); set it below the smallest context")


def _generative_places(policy: Policy) -> Iterator[tuple[Loc, str | None]]:
    """Every place that names a pool generative requests are sent to, with the pool it names."""
    routing = policy.routing
    if routing.tiers:
        yield from ((("routing", "tiers", i), pool) for i, pool in enumerate(routing.tiers))
    else:
        yield from ((("routing", key), getattr(routing, key)) for key in ("micro_pool", "flagship_pool"))
    yield from ((("routing", "rules", i, "pool"), rule.pool) for i, rule in enumerate(routing.rules))
    for i, step in enumerate(policy.degradation.steps):
        yield ("degradation", "steps", i, "pool"), step.pool
        if step.remap is not None:
            yield ("degradation", "steps", i, "action", "to_pool"), step.remap[1]
    shadow = policy.learning.shadow
    yield ("learning", "shadow", "flagship_pool"), shadow.flagship_pool
    yield ("learning", "shadow", "judge_pool"), shadow.judge_pool


def _kind_problems(policy: Policy) -> Iterator[Problem]:
    """An embedding pool (`kind: embedding`) serves /v1/embeddings only: it is never a routing target, a ladder
    step's pool, nor a shadow pool; an on-demand pool falls back to a pool of its own kind."""
    for loc, name in _generative_places(policy):
        if name is not None and name in policy.pools and is_embedding(policy.pools[name]):
            yield loc, (f"pool {name!r} is an embedding pool (kind: embedding), which serves /v1/embeddings only; "
                        "name a generative pool here")
    for name, spec in policy.pools.items():
        fallback = getattr(getattr(spec, "on_demand", None), "fallback_pool", None)
        if fallback in policy.pools and policy.pools[fallback].kind != spec.kind:
            yield (("pools", name, "on_demand", "on_cold"),
                   f"pool {fallback!r} is {policy.pools[fallback].kind} and {name!r} {spec.kind}: a cold pool falls "
                   "back to a pool of its own kind")


def _batch_problems(policy: Policy) -> Iterator[Problem]:
    """`batches.engine_priority` with no engine that schedules by priority would change nothing: say so."""
    if policy.batches.engine_priority is None:
        return
    if not any(priority_engines(spec) for spec in policy.pools.values()):
        yield ("batches", "engine_priority"), (
            "no pool's engine schedules by priority, so no batch line would carry it: add "
            f"{' '.join(PRIORITY_SCHEDULING)} to a local pool's engine.extra_args, or remove engine_priority")


def reference_problems(policy: Policy) -> list[Problem]:
    """Every cross-reference problem of a schema-valid policy (empty when it is usable)."""
    return [*_rule_problems(policy), *_tenant_problems(policy), *_ladder_problems(policy),
            *_on_demand_problems(policy), *_learning_problems(policy), *_autoscale_problems(policy),
            *tier_problems(policy), *_limit_problems(policy), *_kind_problems(policy), *_batch_problems(policy)]
