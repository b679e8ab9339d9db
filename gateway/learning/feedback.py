"""`POST /v1/feedback`: a client's judgement of one of its own answers, kept beside the request's record.

Contract: the body is ``{"request_id": str, "score": number in [0, 1] | "thumbs": "up" | "down",
"comment"?: str}`` (exactly one of `score` and `thumbs`; `comment` at most `MAX_COMMENT_CHARS`). Only the
tenant that made the request may rate it: an unknown id, or another tenant's, is a 404 and nothing is
stored. Feedback is stored under `router_models.training.ledger_labels.LabelKeys.feedback` for the ledger's
retention; a second feedback for the same id replaces the first. `router_models.training.ledger_labels.
read_ledger_labels` reads it as the quality of the pool that served the answer (a label per pool, any pool; `cascade
router memory add --from-ledger`) and, on a micro answer, as a training label (`needs_flagship = 1 - score`).
"""

from __future__ import annotations

import time
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gateway.errors import BadRequest, GatewayError
from gateway.learning.store import LearningStore
from gateway.telemetry.metrics import GatewayMetrics
from policies.loader import dotted_path

__all__ = ["MAX_BODY_BYTES", "MAX_COMMENT_CHARS", "Feedback", "FeedbackService", "RequestNotFound",
           "parse_feedback"]

MAX_COMMENT_CHARS = 2000
MAX_BODY_BYTES = 16 * 1024


class RequestNotFound(GatewayError, status=404, type="invalid_request_error", code="request_not_found"):
    """No request of the caller's tenant has this id (unknown, expired, or another tenant's)."""


class Feedback(BaseModel):
    """A validated feedback body. `value` is the score in [0, 1] (thumbs up = 1, down = 0)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    request_id: str = Field(min_length=1, max_length=128, pattern=r"^[\x21-\x7e]+$")
    score: float | None = Field(default=None, ge=0, le=1, strict=True)
    thumbs: Literal["up", "down"] | None = None
    comment: str | None = Field(default=None, max_length=MAX_COMMENT_CHARS)

    @model_validator(mode="after")
    def _one_rating(self) -> Feedback:
        if (self.score is None) == (self.thumbs is None):
            raise ValueError("give exactly one of `score` (0..1) and `thumbs` (up or down)")
        return self

    @property
    def value(self) -> float:
        if self.score is not None:
            return float(self.score)
        return 1.0 if self.thumbs == "up" else 0.0


def parse_feedback(body: bytes) -> Feedback:
    """Parse a feedback body. Raises `BadRequest` naming the offending field (`param`)."""
    try:
        raw: Any = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}", code="invalid_json") from exc
    if not isinstance(raw, dict):
        raise BadRequest("request body must be a JSON object", code="invalid_json")
    try:
        return Feedback.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        param = dotted_path(tuple(first["loc"])) or ("score" if "score" not in raw else "thumbs")
        raise BadRequest(f"{param}: {first['msg']}", param=param, code="invalid_value") from exc


class FeedbackService:
    """Checks ownership and stores feedback. Shares the store and the metrics."""

    def __init__(self, store: LearningStore, ttl_s: int, metrics: GatewayMetrics) -> None:
        self._store = store
        self._ttl_s = ttl_s
        self._metrics = metrics

    async def submit(self, tenant: str, feedback: Feedback) -> dict[str, Any]:
        """Store `feedback` from `tenant`; the response object. Raises `RequestNotFound` (nothing stored)."""
        if not await self._store.owned_by(feedback.request_id, tenant):
            self._metrics.feedback.labels("not_found").inc()
            raise RequestNotFound(f"no request {feedback.request_id!r} of yours is on record (unknown or "
                                  "expired id; use the x-request-id of your own response)", param="request_id")
        fields = {"score": repr(feedback.value), "thumbs": feedback.thumbs or "", "comment": feedback.comment or "",
                  "tenant": tenant, "at": repr(time.time())}
        await self._store.put(self._store.labels.feedback(feedback.request_id), fields, self._ttl_s)
        self._metrics.feedback.labels("thumbs" if feedback.thumbs else "score").inc()
        return {"object": "feedback", "request_id": feedback.request_id, "score": feedback.value, "stored": True}
