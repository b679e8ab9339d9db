"""The `POST /v1/feedback` route: authenticate like the chat route, parse, call `FeedbackService`, render.

Every refusal is the OpenAI error envelope: 401 (key), 400 (body, with `param`; also when this gateway
runs without the Redis ledger), 413 (body over `MAX_BODY_BYTES`), 404 (not the caller's request).
"""

from __future__ import annotations

import orjson
from starlette.requests import Request
from starlette.responses import Response

from gateway.api.body_limit import BodyLimit
from gateway.api.runtime import Runtime
from gateway.errors import BadRequest, GatewayError
from gateway.learning.feedback import MAX_BODY_BYTES, parse_feedback

__all__ = ["post_feedback"]


async def _read_body(request: Request, limit: int) -> bytes:
    bound = BodyLimit(limit)
    bound.check_declared(request.headers)
    return await bound.read(request.stream())


async def post_feedback(request: Request) -> Response:
    runtime: Runtime = request.app.state.runtime
    try:
        policy, authorization = runtime.policies.current.policy, request.headers.get("authorization")
        client = request.client.host if request.client else None
        tenant = (await runtime.keys.identify(policy, authorization, client)).tenant  # policy keys, issued ones
        try:
            feedback = parse_feedback(await _read_body(request, MAX_BODY_BYTES))
        except BadRequest:
            runtime.metrics.feedback.labels("invalid").inc()
            raise
        if runtime.feedback is None:
            raise BadRequest("this gateway runs without the Redis ledger; feedback is not stored",
                             code="feedback_unavailable")
        result = await runtime.feedback.submit(tenant, feedback)
    except GatewayError as exc:
        return Response(exc.body(), exc.status, exc.headers(), media_type="application/json")
    return Response(orjson.dumps(result), media_type="application/json")
