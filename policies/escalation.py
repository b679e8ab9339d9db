"""Where the cascade may send an unsure micro answer: the same policy a request meets, applied to the flagship.

Pure: no I/O. `escalation()` answers for one request, after the micro pool answered with too little
confidence. In order, the micro answer is kept (`Escalation.pool` None, `held` says why) when:

1. the tenant is over budget and its policy downgrades (`held` "budget"): it must not pay flagship prices;
2. the tenant's `allowed_pools` exclude the flagship pool ("tenant-pools");
3. a `raise_threshold` ladder step is active ("ladder:<step>"): it keeps borderline requests off the
   flagship, and an unsure answer to a prompt the score sent to micro is such a request;
4. the ladder moves the flagship's traffic (`fallback_pool` / `overflow`) to the micro pool ("ladder:<step>");
5. a `shed` step acting on the target pool would shed this tenant there ("shed").

Otherwise the target is the flagship pool, or where the ladder moves its traffic when the tenant may use
that pool (as in `policies.decide`: a move to a pool the tenant may not use is not taken). Waking an
on-demand target, and a target with no replica, are the gateway's (`gateway.serving.sending.cascade_flow`).
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.ladder import LadderState
from policies.schema import Policy
from policies.tenant_moves import move_refused
from policies.tiers import tier_above

__all__ = ["Escalation", "escalation"]


@dataclass(frozen=True, slots=True)
class Escalation:
    """`pool`: where the request goes instead of the micro answer, or None to keep the micro answer; `held`:
    a short code for why not (None when it escalates); `reason`: one sentence for logs and the ledger."""

    pool: str | None
    held: str | None
    reason: str


def escalation(policy: Policy, tenant: str, ladder: LadderState, downgrade: bool,
               pool: str | None = None) -> Escalation:
    """The escalation for `tenant` now (see the module docstring for the order) of an answer from `pool` (used
    with `routing.tiers` only: else the micro pool). With `routing.tiers` the target is the tier one up from `pool`
    (`policies.tiers.tier_above`; the top tier is held: "top-tier"), and "the flagship" above reads as that tier."""
    routing = policy.routing
    micro = pool if pool is not None and routing.tiers else routing.micro_pool
    flagship = tier_above(policy, micro)
    spec = policy.tenants.get(tenant)
    allowed = spec.allowed_pools if spec is not None else None
    if downgrade:
        return Escalation(None, "budget", f"tenant {tenant!r} is over budget (policy: downgrade)")
    if flagship is None:
        return Escalation(None, "top-tier", f"{micro!r} is the top tier: there is none to escalate to")
    refused = move_refused(policy, tenant, flagship, LadderState(), downgrade)  # the ladder's turn is below
    if refused is not None:
        return Escalation(None, refused.code, refused.reason)
    if ladder.threshold is not None:
        return Escalation(None, f"ladder:{ladder.threshold_step}",
                          f"ladder step {ladder.threshold_step!r} keeps borderline requests off {flagship!r}")
    target, steps = ladder.route(flagship)
    if steps and allowed is not None and target not in allowed:
        target, steps = flagship, ()
    if target == micro:
        return Escalation(None, f"ladder:{steps[-1]}", f"ladder step {steps[-1]!r} moves {flagship!r} -> {micro!r}")
    refused = move_refused(policy, tenant, target, ladder, downgrade)
    if refused is not None:
        return Escalation(None, refused.code, refused.reason)
    moved = f"; ladder step(s) {list(steps)} move {flagship!r} -> {target!r}" if steps else ""
    return Escalation(target, None, f"escalated to {target!r}{moved}")
