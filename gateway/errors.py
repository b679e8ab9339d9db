"""One error tree for the gateway, rendered once as the OpenAI error envelope.

Services raise these; `gateway.app` turns them into `{"error": {"message", "type", "param", "code"}}`
with the status code. Anything else that escapes a handler is logged and rendered as a generic 500
without a stack trace.
"""

from __future__ import annotations

from typing import Any

import orjson

__all__ = [
    "AuthenticationError",
    "BadRequest",
    "BodyTooLarge",
    "DeadlineExceeded",
    "GatewayError",
    "ModelNotFound",
    "NoReplicaAvailable",
    "UpstreamError",
    "error_body",
]


class GatewayError(Exception):
    """Base of every error the gateway shows to a client."""

    status: int = 500
    type: str = "internal_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.param, self.code)


class BadRequest(GatewayError):
    status = 400
    type = "invalid_request_error"


class BodyTooLarge(GatewayError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class AuthenticationError(GatewayError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class ModelNotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "model_not_found"


class NoReplicaAvailable(GatewayError):
    """No replica of the chosen pool could take the request (all down, or all failed before any byte)."""

    status = 503
    type = "service_unavailable"
    code = "engine_unavailable"


class DeadlineExceeded(GatewayError):
    """The request did not get an answer (or, streaming, a first token) within the gateway's deadline."""

    status = 504
    type = "timeout_error"
    code = "deadline_exceeded"


class UpstreamError(GatewayError):
    """The engine answered with an error we pass on (its status and message, our envelope)."""

    type = "upstream_error"

    def __init__(self, message: str, status: int, *, param: str | None = None, code: str | None = None):
        super().__init__(message, param=param, code=code)
        self.status = status


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> bytes:
    payload: dict[str, Any] = {"message": message, "type": type_, "param": param, "code": code}
    return orjson.dumps({"error": payload})
