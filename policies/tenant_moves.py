"""Whether the gateway may move a tenant's request to another pool than the one it was routed to: one decision
for every path that picks another pool after routing (failover when a pool has no replica, an on-demand pool's
cold fallback, cascade escalation, a conversation too long for its pool). Pure: no I/O.

A move to `target` is refused, in order, when:
1. the tenant's `allowed_pools` exclude it ("tenant-pools");
2. the tenant is over budget and its policy downgrades, and `target` is the flagship pool, or with `routing.tiers`
   any tier above the first ("budget"): it must not pay dearer prices because the pool it could pay for had no
   replica;
3. a `shed` step acting on `target` would shed this tenant there ("shed").
Routing itself (`policies.decide`) applies the same rules to the pool it picks first.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.decide import RouteDecision
from policies.ladder import LadderState
from policies.schema import Policy
from policies.tiers import neighbours, tiers_of

__all__ = ["Refusal", "move_refused", "other_tier", "other_tiers"]


@dataclass(frozen=True, slots=True)
class Refusal:
    """`code`: a short label for logs and metrics; `reason`: one sentence."""

    code: str
    reason: str


def move_refused(policy: Policy, tenant: str, target: str, ladder: LadderState, downgrade: bool) -> Refusal | None:
    """Why `tenant`'s request may not go to `target` now, or None when it may (see the module docstring)."""
    spec = policy.tenants.get(tenant)
    if spec is not None and spec.allowed_pools is not None and target not in spec.allowed_pools:
        return Refusal("tenant-pools", f"tenant {tenant!r} may not use {target!r}")
    if downgrade and target in tiers_of(policy)[1:]:
        return Refusal("budget", f"tenant {tenant!r} is over budget (policy: downgrade)")
    if ladder.applying_to(target).shed_retry_after(spec.priority if spec is not None else 0) is not None:
        return Refusal("shed", f"the ladder sheds tenant {tenant!r} on {target!r}")
    return None


def other_tiers(policy: Policy, decision: RouteDecision, tenant: str, ladder: LadderState,
                downgrade: bool) -> tuple[str, ...]:
    """The tiers a routed request may move to, in the order to try them (`policies.tiers.neighbours`: the next
    tier up, then down, then further out; without `routing.tiers` the other of micro and flagship), those the
    tenant may be moved to; empty for a pinned model (its caller asked for that model) or a pool that is no tier."""
    if decision.rule == "pinned":
        return ()
    return tuple(p for p in neighbours(policy, decision.pool)
                 if move_refused(policy, tenant, p, ladder, downgrade) is None)


def other_tier(policy: Policy, decision: RouteDecision, tenant: str, ladder: LadderState,
               downgrade: bool) -> str | None:
    """The first of `other_tiers` (micro for the flagship and back in a two-pool policy), or None."""
    return next(iter(other_tiers(policy, decision, tenant, ladder, downgrade)), None)
