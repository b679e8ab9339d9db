"""The quality figures a cost report carries beside its savings (estimated by `gateway.costs.quality`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["APPROXIMATION", "LabelEstimate", "QualityEstimate"]

APPROXIMATION = "pinned-model requests and cascade probes count as routed (rollups keep no rule)"


@dataclass(frozen=True, slots=True)
class LabelEstimate:
    """Quality measured on labelled requests: `kept` of `labelled` micro-routed ones did not need the flagship."""

    kept: float
    labelled: int
    basis: str = "feedback, shadow and escalation labels, all time"


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
        return out

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
        }
