"""Whether the gateway may move a tenant's request to another pool than the one it was routed to: one decision
for every path that picks another pool after routing (failover when a pool has no replica, an on-demand pool's
cold fallback, cascade escalation, a conversation too long for its pool). Pure: no I/O.

A move to `target` is refused, in order, when:
1. the tenant's `allowed_pools` exclude it ("tenant-pools");
2. the tenant is over budget and its policy downgrades, and `target` is the flagship pool ("budget"): it must not
   pay flagship prices because the pool it could pay for had no replica;
3. a `shed` step acting on `target` would shed this tenant there ("shed").
Routing itself (`policies.decide`) applies the same rules to the pool it picks first.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.decide import RouteDecision
from policies.ladder import LadderState
from policies.schema import Policy

__all__ = ["Refusal", "move_refused", "other_tier"]


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
    if downgrade and target == policy.routing.flagship_pool:
        return Refusal("budget", f"tenant {tenant!r} is over budget (policy: downgrade)")
    if ladder.applying_to(target).shed_retry_after(spec.priority if spec is not None else 0) is not None:
        return Refusal("shed", f"the ladder sheds tenant {tenant!r} on {target!r}")
    return None


def other_tier(policy: Policy, decision: RouteDecision, tenant: str, ladder: LadderState,
               downgrade: bool) -> str | None:
    """The other tier (micro for the flagship and back) of a routed request, where the tenant may be moved there;
    None for a pinned model (its caller asked for that model) or a pool that is neither tier."""
    routing = policy.routing
    if decision.rule == "pinned" or decision.pool not in (routing.micro_pool, routing.flagship_pool):
        return None
    other = routing.flagship_pool if decision.pool == routing.micro_pool else routing.micro_pool
    if other == decision.pool or move_refused(policy, tenant, other, ladder, downgrade) is not None:
        return None
    return other
