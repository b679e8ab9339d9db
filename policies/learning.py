"""The policy's `learning:` section: what the gateway keeps of its own traffic so the router can learn from it,
and how often it retrains the router on what it kept.

Every part is off by default. Kept prompts are user data (the text of their requests): turn them on only
where that is allowed, with a TTL that matches the retention you promise.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from policies.frozen import Frozen
from policies.money import usd_to_micro

__all__ = ["HoldThreshold", "InDomain", "KeepPrompts", "LabelMemory", "Learning", "Retrain", "Shadow"]


class KeepPrompts(Frozen):
    """Keep a sample of scored requests (the text the scorer saw, the score, the pool, the tenant, the time)
    in Redis for `ttl_days`, so feedback, shadow verdicts and cascade escalations can label them."""

    sample: float = Field(default=0.0, ge=0, le=1, description="share of scored requests kept (0: off)")
    ttl_days: int = Field(default=30, ge=1, le=366, description="days a kept prompt and its labels live")


class Shadow(Frozen):
    """Ask the flagship too, off the response path, for a share of kept requests that the micro pool answered,
    and have a judge pool say which answer is better (shown in an order drawn per request; with `both_orders`,
in both orders). Both calls are priced and recorded in the
    ledger (status "shadow", tenant "cascade.shadow"), never charged to the client's tenant; a daily budget
    caps what they spend."""

    sample: float = Field(default=0.0, ge=0, le=1, description="share of kept micro answers compared (0: off)")
    flagship_pool: str | None = Field(default=None, description="pool asked for the reference answer "
                                      "(default: routing.flagship_pool)")
    judge_pool: str | None = Field(default=None, description="pool that judges the two answers")
    daily_budget_usd: int = Field(default=0, description="USD per UTC day for shadow and judge calls together, "
                                  "e.g. 5.00 (0: no calls)", json_schema_extra={"type": ["string", "number"]})
    max_tokens: int = Field(default=512, ge=1, le=32_768, description="completion limit of the flagship call")
    max_in_flight: int = Field(default=2, ge=1, le=64, description="comparisons at once per gateway process; "
                               "more are skipped, not queued")
    both_orders: bool = Field(default=False, strict=True, description="judge each pair twice, the answers "
                              "swapped, and keep a verdict only when both orders agree (twice the judge's cost; "
                              "the second call is skipped when the budget is spent)")

    @field_validator("daily_budget_usd", mode="before")
    @classmethod
    def _parse_usd(cls, value: Any) -> int:
        return usd_to_micro(value)


class Retrain(Frozen):
    """Retrain the router on a schedule from the labelled requests in the ledger (`gateway.learning.retrain`):
    every `every_hours`, when at least `min_new_labels` labelled requests are new since the last training,
    `cascade router train --from-ledger` runs in a niced subprocess; it promotes its candidate into the
    artifact store only when it beats the current artifact on `held_back` of those labels, and the gateway
    swaps the promoted artifact in without a restart. Needs the Redis ledger and a gateway that serves the
    store (no `--router-artifact`)."""

    every_hours: int = Field(default=0, ge=0, le=8784, description="hours between two looks at the labels "
                             "(0: off); the first look comes at start when none was made before")
    min_new_labels: int = Field(default=200, ge=10, le=10_000_000, description="labelled requests the "
                                "last training did not see, needed to train again (fewer: the look is skipped)")
    held_back: float = Field(default=0.3, ge=0.05, le=0.9, description="share of the labels kept out of "
                             "training to compare the candidate with the current artifact")
    embedder: str | None = Field(default=None, description="embedder of the candidate, e.g. "
                                 "all-MiniLM-L6-v2:static:t64 (default: the trainer's, the shipped artifact's)")
    timeout_minutes: int = Field(default=60, ge=1, le=1440, description="a training still running after "
                                 "this long is stopped and counted as failed")


class LabelMemory(Frozen):
    """Label memories (`cascade router memory add`): labelled prompts that move the router's score of requests
    near them at once, without retraining (`router_models.serving.label_memory`; MODEL_CARD.md, "Learning
    curve"). `scope` says whose labels a request reads: `tenant` (the memory named after its tenant, so one
    tenant's labels never move another's scores), `shared` (the `shared` memory, for every tenant) or `none`
    (the default)."""

    scope: Literal["none", "tenant", "shared"] = Field(default="none", description="whose label memory moves a "
                                                      "request's score: none, tenant (its own) or shared")


class HoldThreshold(Frozen):
    """A safer threshold for a drifting tenant: its requests go to the flagship from score `threshold` on (when
    that is below the threshold the policy routes with, never above: more flagship, not less) until the tenant's
    own label memory (`learning.label_memory`, scope tenant) holds `until_labels` labels."""

    threshold: float = Field(gt=0, lt=1, description="score from which a drifting tenant's requests go to the "
                             "flagship pool (lower: more flagship)")
    until_labels: int = Field(default=200, ge=1, le=10_000_000, description="labels of the tenant's own label "
                              "memory after which its usual threshold applies again")


class InDomain(Frozen):
    """Traffic unlike the router's training data (`router_models.serving.domain`: each scored request's in-domain
    figure in [0, 1]). A request below `bound` is "unlike"; a tenant is drifting while more than `drift_share` of
    its last `window` scored requests (at least `min_requests` of them) are. The cost report states the share below
    `bound` and widens its quality-kept range with it; a drifting tenant is named in the log and the report and,
    with `hold`, routed at a safer threshold. Kept prompts and shadow comparisons are drawn up to `unlike_sampling`
    times as often for a request of figure 0 (linear in 1 - figure), so the labels arrive where the router knows
    least."""

    bound: float = Field(default=0.3, gt=0, lt=1, description="in-domain figure below which a request counts as "
                         "unlike the training data: a multiple of 0.1 (the ledger counts tenths)")
    drift_share: float = Field(default=0.4, gt=0, le=1, description="share of a tenant's requests below the bound "
                               "past which it is drifting")
    window: int = Field(default=500, ge=10, le=100_000, description="a tenant's latest scored requests its drift "
                        "is judged on (per gateway process)")
    min_requests: int = Field(default=100, ge=1, le=100_000, description="scored requests of a tenant needed "
                              "before its drift is judged")
    unlike_sampling: float = Field(default=4.0, ge=1, le=100, description="how many times as often a request of "
                                   "figure 0 is kept and shadow-compared (1: no change)")
    hold: HoldThreshold | None = Field(default=None, description="route a drifting tenant at a safer threshold "
                                       "until enough of its own labels have arrived (default: off)")

    @field_validator("bound")
    @classmethod
    def _tenths(cls, value: float) -> float:
        if abs(value * 10 - round(value * 10)) > 1e-9:
            raise ValueError(f"bound must be a multiple of 0.1 (0.1 .. 0.9): the ledger counts in-domain figures in "
                             f"tenths, so a report can tell the share below it; got {value}")
        return round(value, 1)

    @model_validator(mode="after")
    def _window_holds_minimum(self) -> InDomain:
        if self.min_requests > self.window:
            raise ValueError(f"min_requests ({self.min_requests}) cannot exceed window ({self.window}): the "
                             "drift would never be judged")
        return self

    def sampling_factor(self, in_domain: float | None) -> float:
        """How many times as often a request of this figure is kept and compared: 1 + (unlike_sampling - 1) *
        (1 - figure); 1 without a figure."""
        if in_domain is None:
            return 1.0
        return 1.0 + (self.unlike_sampling - 1.0) * (1.0 - min(1.0, max(0.0, in_domain)))


class Learning(Frozen):
    keep_prompts: KeepPrompts = KeepPrompts()
    shadow: Shadow = Shadow()
    retrain: Retrain = Retrain()
    label_memory: LabelMemory = LabelMemory()
    in_domain: InDomain = InDomain()
