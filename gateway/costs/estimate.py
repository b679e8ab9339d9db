"""The quality figures a cost report carries beside its savings (estimated by `gateway.costs.quality`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["APPROXIMATION", "DomainShare", "LabelEstimate", "QualityEstimate"]

APPROXIMATION = "pinned-model requests and cascade probes count as routed (rollups keep no rule)"


@dataclass(frozen=True, slots=True)
class LabelEstimate:
    """Quality measured on labelled requests: `kept` of `labelled` micro-routed ones did not need the flagship."""

    kept: float
    labelled: int
    basis: str = "feedback, shadow and escalation labels, all time"


@dataclass(frozen=True, slots=True)
class DomainShare:
    """Traffic unlike the router's training data in a report (`gateway.costs.domain`): of `scored` requests with an
    in-domain figure, `below` fell under `bound`; the quality kept widens with their share into `kept_low` ..
    `kept_high` (None when there is no point estimate or no spread to widen it by: `unavailable` says why);
    `drifting` names each tenant past `drift_share` (tenant, below, scored)."""

    bound: float
    scored: int
    below: int
    kept_low: float | None
    kept_high: float | None
    spread_basis: str
    drift_share: float
    drifting: tuple[tuple[str, int, int], ...] = ()
    unavailable: str | None = None

    @property
    def share(self) -> float | None:
        return self.below / self.scored if self.scored else None

    def lines(self) -> list[str]:
        if self.share is None:
            return [f"in-domain figure: no scored request carries one ({self.unavailable or 'none recorded'})"]
        out = [f"unlike the training data: {self.share:.1%} of {self.scored:,} scored requests have an in-domain "
               f"figure below {self.bound:.1f}"]
        if self.kept_low is not None and self.kept_high is not None:
            out.append(f"quality kept, range: {self.kept_low:.2f} .. {self.kept_high:.2f} (the unlike share weighed "
                       f"at the leave-one-source-out spread: {self.spread_basis})")
        elif self.unavailable:
            out.append(f"quality kept, range unavailable ({self.unavailable})")
        out += [f"WARNING: tenant {tenant!r} drifts from the training data: {below / scored:.1%} of its {scored:,} "
                f"scored requests below {self.bound:.1f} (policy learning.in_domain.drift_share {self.drift_share:g})"
                for tenant, below, scored in self.drifting]
        return out

    def fields(self) -> dict[str, Any]:
        return {
            "in_domain_bound": self.bound,
            "in_domain_scored": self.scored,
            "in_domain_below": self.below,
            "unlike_share": self.share,
            "quality_kept_low": self.kept_low,
            "quality_kept_high": self.kept_high,
            "quality_range_basis": self.spread_basis,
            "quality_range_unavailable": self.unavailable,
            "drifting_tenants": [{"tenant": t, "below": b, "scored": n} for t, b, n in self.drifting],
        }


@dataclass(frozen=True, slots=True)
class QualityEstimate:
    """Quality kept by routing. `curve_kept` is None when `unavailable` says why; `flagship_share` is None
    when the report has no request on the micro or flagship pool."""

    flagship_share: float | None
    routed_requests: int
    curve_kept: float | None
    basis: str | None
    unavailable: str | None
    labels: LabelEstimate | None = None
    overflow_share: float = 0.0  # of the routed requests, those the router's overflow model scored
    overflow_note: str = ""  # how the estimate weighed them
    domain: DomainShare | None = None  # traffic unlike the training data, and the range it gives the estimate

    def lines(self) -> list[str]:
        """The quality figures as report lines (table, HTML)."""
        share = "-" if self.flagship_share is None else f"{self.flagship_share:.0%}"
        if self.curve_kept is not None:
            note = f"; {self.overflow_note}" if self.overflow_note else ""
            out = [f"quality kept: ~{self.curve_kept:.2f} of the micro->flagship gap ({self.basis}, realised "
                   f"flagship share {share}{note}; {APPROXIMATION})"]
        else:
            out = [f"quality estimate unavailable ({self.unavailable})"]
        if self.labels is not None:
            out.append(f"labelled quality: {self.labels.kept:.2f} of {self.labels.labelled} micro-routed labelled "
                       f"requests did not need the flagship ({self.labels.basis})")
        return out + ([] if self.domain is None else self.domain.lines())

    def fields(self) -> dict[str, Any]:
        """Machine-readable figures (JSON, CSV)."""
        labels = self.labels
        return {
            "realised_flagship_share": self.flagship_share,
            "routed_requests": self.routed_requests,
            "quality_kept_pgr": self.curve_kept,
            "quality_basis": self.basis,
            "quality_unavailable": self.unavailable,
            "overflow_scored_share": self.overflow_share,
            "labelled_kept": None if labels is None else labels.kept,
            "labelled_requests": None if labels is None else labels.labelled,
            **({} if self.domain is None else self.domain.fields()),
        }
