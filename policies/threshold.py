"""The routing threshold: a fixed score, or a target share of traffic for the flagship. Pure.

`routing.threshold` is either a float in [0, 1] (score >= it goes to the flagship) or a mapping
``{flagship_share: 0.3, window: 2000, initial: 0.5, min_samples: 200}``: the gateway then sets the live
threshold to the (1 - flagship_share) quantile of the last `window` scores of scored `auto` requests (shared
by every worker through Redis), and uses `initial` until `min_samples` scores have been seen. Deciding is
pure, so the live value is computed by the gateway and passed to `policies.decide.decide`.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Discriminator, Field, Tag, model_validator

from policies.frozen import Frozen

__all__ = ["THRESHOLD_TAGS", "ShareThreshold", "Threshold", "base_threshold", "offline_note", "share_target"]


class ShareThreshold(Frozen):
    """Keep the realised flagship share of scored `auto` requests near `flagship_share`."""

    flagship_share: float = Field(gt=0, lt=1, description="target share of scored auto requests for the flagship")
    window: int = Field(default=2000, ge=10, le=100_000, description="recent scores the quantile is taken over")
    initial: float = Field(default=0.5, ge=0, le=1,
                           description="threshold used until `min_samples` scores are seen (and by explain/replay)")
    min_samples: int = Field(default=200, ge=1, description="scores needed before the quantile replaces `initial`")

    @model_validator(mode="after")
    def _samples_fit_window(self) -> ShareThreshold:
        if self.min_samples > self.window:
            raise ValueError(f"min_samples {self.min_samples} exceeds window {self.window}: the quantile would never "
                             "be used; lower min_samples or raise window")
        return self


def _threshold_tag(value: Any) -> str:
    return "share" if isinstance(value, dict | ShareThreshold) else "value"


Threshold = Annotated[
    Annotated[float, Tag("value"), Field(ge=0, le=1)] | Annotated[ShareThreshold, Tag("share")],
    Discriminator(_threshold_tag),
]
"""A float threshold or a `ShareThreshold`; the tag is chosen by shape (a mapping is the share form)."""

THRESHOLD_TAGS = frozenset({"value", "share"})
"""Tags pydantic puts into error locations under `routing.threshold` (the loader hides them from ops)."""


def base_threshold(threshold: float | ShareThreshold) -> float:
    """The threshold a decision uses when no live value is given: the float, or the share form's `initial`."""
    return threshold.initial if isinstance(threshold, ShareThreshold) else threshold


def share_target(threshold: float | ShareThreshold) -> ShareThreshold | None:
    """The share form, or None for a fixed threshold."""
    return threshold if isinstance(threshold, ShareThreshold) else None


def offline_note(name: str, threshold: float | ShareThreshold, override: float | None) -> str | None:
    """What an offline tool (explain, replay) routes `name`'s policy by, when that is not simply its float."""
    if override is not None:
        return f"{name}: routed with routing threshold {override} (--threshold)"
    if isinstance(threshold, ShareThreshold):
        return (f"{name}: routing.threshold targets a flagship share of {threshold.flagship_share:g}, which the "
                f"gateway turns into a live threshold; used here: its `initial` {threshold.initial:g} "
                "(pass --threshold to try another)")
    return None
