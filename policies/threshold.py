"""The routing threshold: a fixed score, or a target share of traffic for the flagship. Pure.

`routing.threshold` is either a float in [0, 1] (score >= it goes to the flagship) or a mapping
``{flagship_share: 0.3, window: 2000, initial: 0.5, min_samples: 200}``: the gateway then sets the live
threshold to the (1 - flagship_share) quantile of the last `window` scores of scored `auto` requests (shared
by every worker through Redis), and uses `initial` until `min_samples` scores have been seen. Deciding is
pure, so the live value is computed by the gateway and passed to `policies.decide.decide`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, model_validator

from policies.frozen import Frozen

__all__ = ["THRESHOLD_TAGS", "ShareThreshold", "Threshold", "ThresholdInUse", "base_threshold", "offline_note",
           "share_target", "threshold_in_use"]


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


def offline_note(name: str, threshold: float | ShareThreshold, override: float | None,
                 live: bool = False) -> str | None:
    """What an offline tool (explain, replay) routes `name`'s policy by, when that is not simply its float. `live`:
    the tool can also ask a running gateway for its threshold (explain's `--gateway` / `--redis-url`), and says so."""
    if override is not None:
        return f"{name}: routed with routing threshold {override} (--threshold)"
    if isinstance(threshold, ShareThreshold):
        ask = ("; --gateway URL (or --redis-url URL --prefix P): the threshold a running gateway uses"
               if live else "")
        return (f"{name}: routing.threshold targets a flagship share of {threshold.flagship_share:g}, which the "
                f"gateway turns into a live threshold; used here: its `initial` {threshold.initial:g} "
                f"(pass --threshold to try another{ask})")
    return None


Source = Literal["policy", "initial", "share-held", "ladder-raised"]


@dataclass(frozen=True, slots=True)
class ThresholdInUse:
    """The routing threshold a gateway compares scores with (a tenant's or a rule's own threshold still wins, as in
    `policies.decide`) and where it came from: `policy` (a fixed float), `initial` (a flagship-share policy with
    fewer than `min_samples` scores in the shared window), `share-held` (the live value that holds the share) or
    `ladder-raised` (a `raise_threshold` ladder step above the routing threshold; `routing` is the one below it)."""

    value: float
    source: Source
    routing: float
    routing_source: Source
    samples: int | None = None  # scores in the shared window (a flagship-share policy)
    ladder_step: str | None = None

    def describe(self) -> str:
        """One line: the value and where it came from."""
        why = {"policy": "the policy's fixed routing.threshold",
               "initial": f"the policy's `initial`: {self.samples or 0} score(s) in the shared window, fewer than "
                          "min_samples",
               "share-held": f"held to the flagship share over the {self.samples} latest scores"}
        line = f"{self.value:g} ({self.source}: "
        if self.source == "ladder-raised":
            return line + (f"ladder step {self.ladder_step!r} raised the routing threshold {self.routing:g}, "
                           f"which is {self.routing_source}: {why[self.routing_source]})")
        return line + why[self.source] + ")"


def threshold_in_use(threshold: float | ShareThreshold, live: float | None, samples: int,
                     ladder_threshold: float | None = None, ladder_step: str | None = None) -> ThresholdInUse:
    """What `policies.decide` compares a score with, given the live value a gateway computed from `samples` scores
    of its shared window (None: none yet) and the ladder's raised threshold (None: no step raises it)."""
    target = share_target(threshold)
    routing: float
    source: Source
    count: int | None
    if target is None:
        routing, source, count = base_threshold(threshold), "policy", None
    elif live is None or samples < target.min_samples:
        routing, source, count = target.initial, "initial", samples
    else:
        routing, source, count = live, "share-held", samples
    if ladder_threshold is not None and ladder_threshold > routing:
        return ThresholdInUse(ladder_threshold, "ladder-raised", routing, source, count, ladder_step)
    return ThresholdInUse(routing, source, routing, source, count)
