"""The share of a report's traffic unlike the router's training data, and the range it gives the quality kept.

The ledger's rollups count each scored request's in-domain figure (`router_models.serving.domain`) in tenths
(`gateway.ledger.record.IN_DOMAIN_COUNTERS`), so the share below the policy's `learning.in_domain.bound` (a multiple
of 0.1) is exact over any date range and grouping.

The quality kept (`gateway.costs.quality`) is the router's leave-one-source-out curve at the realised flagship share:
the mean over held-out sources. For traffic like the training data that mean is the estimate; for traffic unlike it,
the quality could be anywhere in the spread of the held-out sources. The artifact stores each held-out source's APGR
(`evaluation.per_source`); its lift over random routing (APGR - 0.5) against the mean's is the factor by which that
source's curve rose above random, so at flagship share s with curve PGR p, the lowest and highest sources are read
as s + (p - s) * lift_min and s + (p - s) * lift_max (within [0, 1]). With u the share below the bound, the range
is (1 - u) * kept + u * that pair: a point when nothing is unlike the training data, as wide as the spread when all
of it is. An approximation (each source's curve as the mean's lift scaled), stated in the output.

A tenant drifts when more than `drift_share` of its scored requests in the report (at least `min_requests`) are
below the bound: the report names it (the gateway's log does as it happens: `gateway.serving.routing.drift`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from gateway.costs.estimate import DomainShare, QualityEstimate
from gateway.costs.report import CostReport, Counters
from policies.learning import InDomain

__all__ = ["domain_share", "lift_spread"]

_RANDOM_APGR = 0.5


def lift_spread(metadata: Mapping[str, Any]) -> tuple[float, float, str] | None:
    """(lowest, highest) held-out source's lift over random routing as a multiple of the mean's, and a note naming
    them; None when the artifact's metadata has no per-source figures or a mean no better than random."""
    evaluation = metadata.get("evaluation")
    per_source = evaluation.get("per_source") if isinstance(evaluation, dict) else None
    if not isinstance(per_source, dict) or not per_source:
        return None
    try:
        apgr = {str(name): float(row["apgr"]) for name, row in per_source.items()}
    except (KeyError, TypeError, ValueError):
        return None
    mean = sum(apgr.values()) / len(apgr)
    if not mean - _RANDOM_APGR > 1e-6:
        return None
    low, high = min(apgr, key=apgr.__getitem__), max(apgr, key=apgr.__getitem__)
    lift = mean - _RANDOM_APGR
    note = (f"held-out sources' APGR {apgr[low]:.3f} ({low}) .. {apgr[high]:.3f} ({high}) around the mean "
            f"{mean:.3f}; each source's curve taken as the mean's lift over random routing scaled")
    return (apgr[low] - _RANDOM_APGR) / lift, (apgr[high] - _RANDOM_APGR) / lift, note


def _drifting(report: CostReport, spec: InDomain) -> tuple[tuple[str, int, int], ...]:
    by_tenant: dict[str, Counters] = defaultdict(Counters)
    for cell in report.cells:
        by_tenant[cell.tenant] = by_tenant[cell.tenant] + cell.counters
    out = []
    for tenant, counters in sorted(by_tenant.items()):
        scored, below = counters.in_domain_scored, counters.in_domain_below(spec.bound)
        if scored >= spec.min_requests and below > spec.drift_share * scored:
            out.append((tenant, below, scored))
    return tuple(out)


def domain_share(report: CostReport, spec: InDomain, quality: QualityEstimate,
                 artifact_meta: Mapping[str, Any] | None) -> DomainShare:
    """The report's unlike share, the quality-kept range around `quality` (from the per-source figures in the
    artifact's metadata `artifact_meta`; None: unreadable) and its drifting tenants."""
    total = report.total().counters
    scored, below = total.in_domain_scored, total.in_domain_below(spec.bound)
    base = DomainShare(spec.bound, scored, below, None, None, "", spec.drift_share, _drifting(report, spec))
    if not scored:
        return _with(base, "no request in the range has an in-domain figure (the artifact may have no domain "
                           "reference: `cascade router domain build`)")
    if quality.curve_kept is None or quality.flagship_share is None:
        return _with(base, "no quality estimate to widen")
    spread = lift_spread(artifact_meta) if artifact_meta is not None else None
    if spread is None:
        return _with(base, "the artifact stores no per-source leave-one-source-out figures")
    low_lift, high_lift, note = spread
    share, kept, unlike = quality.flagship_share, quality.curve_kept, below / scored
    curve_lift = kept - share  # the point estimate's lift over random routing (an overflow share weighed in)
    low = min(1.0, max(0.0, share + curve_lift * low_lift))
    high = min(1.0, max(0.0, share + curve_lift * high_lift))
    return DomainShare(spec.bound, scored, below, (1 - unlike) * kept + unlike * min(low, kept),
                       (1 - unlike) * kept + unlike * max(high, kept), note, spec.drift_share, base.drifting)


def _with(base: DomainShare, why: str) -> DomainShare:
    return DomainShare(base.bound, base.scored, base.below, None, None, "", base.drift_share, base.drifting, why)

