"""The quality routing is estimated to keep, shown beside the savings in every cost report format.

Two sources, each optional:

- the router's evaluation curve (`router_models.training.quality_curve`, in the artifact's metadata): PGR, the
  share of the micro->flagship quality gap recovered, interpolated at the realised flagship share;
- labels the gateway collected (feedback, shadow judge, cascade escalations; read with
  `router_models.training.ledger_labels.read_ledger_labels`): the share of micro-routed labelled requests that did
  not need the flagship (`label_estimate`; other label-based estimates plug in the same way).

The realised flagship share is flagship-pool requests over micro- plus flagship-pool requests in the
report's rollups. The rollups do not keep the routing rule, so requests pinned to a pool by model name and
cascade probes count as routed: an approximation, stated in the output. They do count the requests that a
surge sent to the router's overflow model (`overflow_scored`; lower quality, `router_models/MODEL_CARD.md`):
that share is weighed at the overflow artifact's curve (the one `--router-overflow auto` pairs with the
primary), or at the primary's when there is none, which the output then says. Labels are not filtered by date.
With a policy, the estimate also carries the share of traffic unlike the router's training data and the range it
gives the quality kept (`gateway.costs.domain`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from gateway.costs.domain import domain_share
from gateway.costs.estimate import LabelEstimate, QualityEstimate
from gateway.costs.report import CostReport
from policies.schema import Policy
from router_models.serving.artifact import ArtifactError, overflow_artifact
from router_models.training.quality_curve import (
    QualityCurve,
    artifact_metadata,
    artifact_quality_curve,
    parse_quality_curve,
)

__all__ = ["estimate_quality", "label_estimate", "read_label_estimate", "served_with_quality", "with_quality"]

log = logging.getLogger("cascade.costs")
NO_CURVE = "artifact has no evaluation curve"


def estimate_quality(pool_requests: Mapping[str, int], micro_pool: str, flagship_pool: str,
                     curve: QualityCurve | None, unavailable: str | None = None,
                     labels: LabelEstimate | None = None, overflow_scored: int = 0,
                     overflow_curve: QualityCurve | None = None) -> QualityEstimate:
    """The estimate for requests per pool. Without `curve`, `unavailable` says why (default: no curve).
    `overflow_scored` of the routed requests were scored by the router's overflow model: that share of the
    estimate comes from `overflow_curve` (the primary's when None, and the note says so)."""
    micro, flagship = pool_requests.get(micro_pool, 0), pool_requests.get(flagship_pool, 0)
    routed = micro + flagship
    share = flagship / routed if routed else None
    if curve is None or share is None:
        reason = unavailable or (NO_CURVE if curve is None else "no request on the micro or flagship pool")
        return QualityEstimate(share, routed, None, None, reason, labels)
    kept, spilled = curve.pgr_at(share), min(1.0, overflow_scored / routed)
    note = ""
    if spilled > 0 and overflow_curve is not None:
        kept = (1.0 - spilled) * kept + spilled * overflow_curve.pgr_at(share)
        note = f"{spilled:.1%} scored by the router's overflow model, weighed at its curve"
    elif spilled > 0:
        note = f"{spilled:.1%} scored by the router's overflow model, counted at the primary's curve (none known)"
    return QualityEstimate(share, routed, kept, f"router eval curve: {curve.basis}", None, labels, spilled, note)


def label_estimate(rows: Iterable[Mapping[str, Any]], micro_pool: str) -> LabelEstimate | None:
    """From label rows (`read_ledger_labels` format): the share of micro-routed ones whose `needs_flagship`
    is below 0.5. None without any micro-routed label."""
    micro = [float(r["needs_flagship"]) for r in rows if r.get("pool") == micro_pool and "needs_flagship" in r]
    if not micro:
        return None
    return LabelEstimate(sum(v < 0.5 for v in micro) / len(micro), len(micro))


def read_label_estimate(redis_url: str, prefix: str, micro_pool: str) -> LabelEstimate | None:
    """`label_estimate` of the labels in Redis; None when there are none or they cannot be read (logged).
    Blocking: call it from a worker thread on the event loop."""
    try:
        from router_models.training.ledger_labels import read_ledger_labels

        rows = read_ledger_labels(redis_url, key_prefix=prefix)
    except Exception as exc:  # labels are an addition to the report: never fail it
        log.warning("learning labels unreadable; report shows the curve estimate only", extra={"error": str(exc)})
        return None
    return label_estimate(rows, micro_pool)


def with_quality(report: CostReport, policy: Policy | None, artifact: Path | None = None,
                 labels: LabelEstimate | None = None, policy_problem: str | None = None) -> CostReport:
    """`report` with its quality estimate; the pools come from `policy` (None: `policy_problem` says why)."""
    if policy is None:
        why = f"no policy to tell the micro and flagship pools: {policy_problem}"
        return replace(report, quality=QualityEstimate(None, 0, None, None, why, labels))
    reason: str | None = None
    meta: dict[str, Any] | None = None  # read once: the curve and the in-domain range's spread both come from it
    try:
        meta = artifact_metadata(artifact)
        curve = parse_quality_curve(meta)
    except (OSError, ValueError) as exc:
        curve, reason = None, f"cannot read the artifact's evaluation curve: {exc}"
    total, routing = report.total(), policy.routing
    overflow = _overflow_curve(artifact) if total.counters.overflow_scored else None
    estimate = estimate_quality(total.pool_requests, routing.micro_pool, routing.flagship_pool, curve,
                                reason, labels, total.counters.overflow_scored, overflow)
    domain = domain_share(report, policy.learning.in_domain, estimate, meta)
    return replace(report, quality=replace(estimate, domain=domain))


def _overflow_curve(primary: Path | None) -> QualityCurve | None:
    """The curve of the overflow artifact `--router-overflow auto` pairs with `primary`; None when there is
    none or it cannot be read (logged)."""
    try:
        path = overflow_artifact(primary, "auto")
        return artifact_quality_curve(path) if path is not None else None
    except (ArtifactError, OSError, ValueError) as exc:
        log.warning("router overflow artifact's curve unreadable; its share counts at the primary's curve",
                    extra={"error": str(exc)})
        return None


async def served_with_quality(report: CostReport, policy: Policy, redis_url: str, prefix: str,
                              artifact: Path | None = None) -> CostReport:
    """`with_quality` for the running gateway (`GET /admin/costs`): the curve of the artifact it was started with
    (`artifact`, its `--router-artifact`; None: the current one of the artifact store) and the labels in its
    Redis, read in a worker thread."""
    import asyncio

    labels = await asyncio.to_thread(read_label_estimate, redis_url, prefix, policy.routing.micro_pool)
    return await asyncio.to_thread(with_quality, report, policy, artifact, labels)
