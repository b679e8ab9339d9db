"""Tenants whose traffic drifts away from the router's training data (policy `learning.in_domain`).

`DomainDrift.observe` takes each scored request's in-domain figure (`router_models.serving.domain`) and keeps, per
tenant, whether each of its latest `window` figures was below `bound`. A tenant with at least `min_requests`
figures of which more than `drift_share` are below the bound is drifting: a warning names it when it starts (and
an info line when it stops), and `drifting(tenant)` says so to the router, which may hold a safer threshold for it
(`learning.in_domain.hold`, `RequestRouter`).

The window is this process's view; under `--workers N` or several gateways on one Redis, `adopt` replaces the
judgement by one on the windows of every process summed (`gateway.serving.routing.drift_sync`), so a tenant whose
traffic is spread thin over many processes (none of which sees `min_requests` of it) is judged on all of it, and every
process holds the same tenants. Without that (no Redis, or it cannot be reached) each process judges its own
window. The cost report states the drift from the ledger's rollups, over any date range
(`gateway.costs.domain`). Requests without a figure do not count. Memory: `window` booleans a tenant.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

from policies.learning import InDomain

__all__ = ["DomainDrift"]

log = logging.getLogger("cascade.router")


@dataclass
class _Window:
    flags: deque[bool] = field(default_factory=deque)
    below: int = 0
    drifting: bool = False


class DomainDrift:
    """Per-tenant windows of in-domain flags. Use from one event loop."""

    def __init__(self) -> None:
        self._windows: dict[str, _Window] = {}
        self._spec: InDomain | None = None  # the policy's, as of the latest request
        self.shared = False  # judged on every process's windows (`adopt`), not this one's alone

    def observe(self, spec: InDomain, tenant: str, in_domain: float | None) -> None:
        """Count one scored request of `tenant` (nothing without a figure); logs when its drift starts or ends."""
        if in_domain is None:
            return
        self._spec = spec
        window = self._windows.setdefault(tenant, _Window())
        low = in_domain < spec.bound
        window.flags.append(low)
        window.below += low
        while len(window.flags) > spec.window:
            window.below -= window.flags.popleft()
        if not self.shared:
            self._judge(spec, tenant, window, window.below, len(window.flags))

    def counts(self) -> dict[str, tuple[int, int]]:
        """Per tenant, (figures below the bound, figures) in this process's window: what it shares."""
        return {tenant: (w.below, len(w.flags)) for tenant, w in self._windows.items() if w.flags}

    def adopt(self, merged: dict[str, tuple[int, int]] | None) -> None:
        """Judge every tenant on `merged` (per tenant, every process's counts summed, this one's included); None:
        on this process's window again (the shared view is unavailable)."""
        self.shared = merged is not None and self._spec is not None
        if merged is None or self._spec is None:
            return
        for tenant in set(merged) | set(self._windows):
            below, total = merged.get(tenant, (0, 0))
            self._judge(self._spec, tenant, self._windows.setdefault(tenant, _Window()), below, total)

    @staticmethod
    def _judge(spec: InDomain, tenant: str, window: _Window, below: int, total: int) -> None:
        share = below / total if total else 0.0
        drifting = total >= spec.min_requests and share > spec.drift_share
        if drifting == window.drifting:
            return
        window.drifting = drifting
        if drifting:
            log.warning("tenant %r drifts from the router's training data: %.0f%% of its last %d scored requests have "
                        "an in-domain figure below %.1f (policy learning.in_domain.drift_share %.2f)",
                        tenant, 100 * share, total, spec.bound, spec.drift_share)
        else:
            log.info("tenant %r no longer drifts: %.0f%% of its last %d scored requests below in-domain %.1f",
                     tenant, 100 * share, total, spec.bound)

    def drifting(self, tenant: str) -> bool:
        window = self._windows.get(tenant)
        return window is not None and window.drifting

    def share_below(self, tenant: str) -> float | None:
        """The share of the tenant's window below the bound; None before its first figure."""
        window = self._windows.get(tenant)
        return None if window is None or not window.flags else window.below / len(window.flags)
