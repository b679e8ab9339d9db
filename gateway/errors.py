"""One error tree for the gateway, rendered once as the OpenAI error envelope.

Services raise these; `gateway.api.app` turns them into `{"error": {"message", "type", "param", "code"}}`
with the status code. Anything else that escapes a handler is logged and rendered as a generic 500
without a stack trace.
"""

from __future__ import annotations

from typing import Any

import orjson

__all__ = [
    "AdmissionUnavailable",
    "AuthenticationError",
    "BadRequest",
    "BodyTooLarge",
    "BudgetExceeded",
    "DeadlineExceeded",
    "GatewayError",
    "InputRefused",
    "ModelNotFound",
    "NoReplicaAvailable",
    "NotFound",
    "PermissionDenied",
    "RateLimited",
    "RetryLater",
    "TooManyRequests",
    "UpstreamError",
    "error_body",
]


class GatewayError(Exception):
    """Base of every error the gateway shows to a client. A subclass states its HTTP status, its `type` and its
    default `code` as class keywords (`class NotFound(GatewayError, status=404, ...)`); one it leaves out is its
    base's."""

    status: int = 500
    type: str = "internal_error"
    code: str | None = None

    def __init_subclass__(cls, *, status: int | None = None, type: str | None = None,
                          code: str | None = None) -> None:
        super().__init_subclass__()
        if status is not None:
            cls.status = status
        if type is not None:
            cls.type = type
        if code is not None:
            cls.code = code

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.param, self.code)

    def headers(self) -> dict[str, str]:
        """Response headers this error needs besides the body (none, unless a subclass says so)."""
        return {}


class BadRequest(GatewayError, status=400, type="invalid_request_error"):
    """400: the request cannot be served as sent (a bad parameter, a body that does not parse, a feature this
    gateway runs without)."""


class InputRefused(BadRequest):
    """A tenant's input guard refused the prompt (`gateway.guards`). `code` names the guard (pii_detected,
    prompt_too_large, language_not_allowed); the message says what was found, never the prompt's text.
    `decisions` is the `x-cascade-guard` header: every guard's decision on this request."""

    def __init__(self, message: str, code: str, decisions: str) -> None:
        super().__init__(message, param="messages", code=code)
        self.decisions = decisions

    def headers(self) -> dict[str, str]:
        return {"x-cascade-guard": self.decisions}


class BodyTooLarge(GatewayError, status=413, type="invalid_request_error", code="request_too_large"):
    """413: a body or an uploaded file over the gateway's limit."""


class AuthenticationError(GatewayError, status=401, type="authentication_error", code="invalid_api_key"):
    """401: no key, or one the gateway does not accept (unknown, revoked or expired; not the admin key where an
    admin endpoint needs it)."""


class PermissionDenied(GatewayError, status=403, type="permission_error", code="pool_not_allowed"):
    """The caller is known but may not use what it asked for (a pool outside its allowed pools)."""


class ModelNotFound(GatewayError, status=404, type="invalid_request_error", code="model_not_found"):
    """404: the model the request names is not served here (to this tenant, or on this endpoint)."""


class NotFound(GatewayError, status=404, type="invalid_request_error", code="not_found"):
    """404 for a thing other than a model (an API key id at `/admin/keys/{id}`)."""


class NoReplicaAvailable(GatewayError, status=503, type="service_unavailable", code="engine_unavailable"):
    """No replica of the chosen pool could take the request (all down, or all failed before any byte)."""


class RetryLater(GatewayError):
    """An error the client may retry after `retry_after_s` whole seconds (>= 1), which the boundary sends as
    the `Retry-After` header."""

    def __init__(self, message: str, retry_after_s: int, *, code: str | None = None) -> None:
        super().__init__(message, code=code)
        self.retry_after_s = max(1, retry_after_s)

    def headers(self) -> dict[str, str]:
        return {"retry-after": str(self.retry_after_s)}


class AdmissionUnavailable(RetryLater, status=503, type="service_unavailable", code="limits_unavailable"):
    """The tenant's rate limits or budget could not be checked (Redis unreachable) and its policy says
    `on_redis_outage: fail_closed`."""

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message, retry_after_s)


class DeadlineExceeded(GatewayError, status=504, type="timeout_error", code="deadline_exceeded"):
    """The request did not get an answer (or, streaming, a first token) within the gateway's deadline."""


class UpstreamError(GatewayError, type="upstream_error"):
    """The engine answered with an error we pass on (its status and message, our envelope)."""

    def __init__(self, message: str, status: int, *, param: str | None = None, code: str | None = None):
        super().__init__(message, param=param, code=code)
        self.status = status


class TooManyRequests(RetryLater, status=429, type="rate_limit_exceeded"):
    """429: too many requests from this client now; `type_` replaces the class's `type`."""

    def __init__(self, message: str, retry_after_s: int, *, type_: str | None = None, code: str | None = None) -> None:
        super().__init__(message, retry_after_s, code=code)
        if type_ is not None:
            self.type = type_


class RateLimited(TooManyRequests, code="rate_limit_exceeded"):
    """Over the tenant's requests or tokens per minute. Like OpenAI: `type` is "requests" or "tokens"
    (the limit that binds), `code` is "rate_limit_exceeded"."""


class BudgetExceeded(TooManyRequests, type="insufficient_quota", code="insufficient_quota"):
    """The tenant spent its daily or monthly budget (policy `on_exceed: reject`). Like OpenAI's quota
    error: `type` and `code` are "insufficient_quota"; `retry_after_s` runs to the UTC period reset."""


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> bytes:
    payload: dict[str, Any] = {"message": message, "type": type_, "param": param, "code": code}
    return orjson.dumps({"error": payload})
