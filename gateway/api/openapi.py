"""The OpenAPI 3.1 description of the gateway's public API, served at `GET /openapi.json`.

The request schemas of the OpenAI endpoints (chat completions, Responses, completions, embeddings) are generated from
the request models the gateway validates with (`ChatRequest`, `ResponsesRequest`, `CompletionsRequest`,
`EmbeddingsRequest`), so the
document and the parser cannot drift apart. Responses are
described loosely where they pass through from the engine (the completion object) and exactly where
the gateway owns them (the OpenAI error envelope, `/healthz`, `/readyz`, `/v1/models`).
Built once per app (pure, no I/O).
"""

from __future__ import annotations

from typing import Any

from gateway.api.openapi_batches import batch_paths, batch_schemas
from gateway.learning.feedback import Feedback
from gateway.serving.openai.completions_schema import CompletionsRequest
from gateway.serving.openai.embeddings_schema import EmbeddingsRequest
from gateway.serving.openai.responses_schema import ResponsesRequest
from gateway.serving.openai.schema import ChatRequest

__all__ = ["ERROR_SCHEMA", "build_openapi"]

_REF = "#/components/schemas/{model}"

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}

_COMPLETION: dict[str, Any] = {
    "type": "object",
    "description": "The engine's chat.completion object (passed through; `model` names the pool that answered).",
    "required": ["id", "object", "choices"],
    "properties": {
        "id": {"type": "string"},
        "object": {"type": "string"},
        "model": {"type": "string"},
        "choices": {"type": "array", "items": {"type": "object"}},
        "usage": {"type": ["object", "null"]},
    },
}

# One server-sent event: `data` is a chat.completion.chunk (or text_completion chunk) as JSON, or `[DONE]` at the
# end; a Responses stream names each event (`event: response.output_text.delta`, ...) and has no `[DONE]`.
_SSE_EVENT: dict[str, Any] = {
    "type": "object",
    "required": ["data"],
    "properties": {"data": {"type": "string"}, "event": {"type": "string"}},
}

_MODELS: dict[str, Any] = {
    "type": "object",
    "required": ["object", "data"],
    "properties": {
        "object": {"const": "list"},
        "data": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["id", "object", "created", "owned_by"],
                "properties": {"id": {"type": "string"}, "object": {"const": "model"},
                               "created": {"type": "integer"}, "owned_by": {"type": "string"}},
            },
        },
    },
}

_READY: dict[str, Any] = {
    "type": "object",
    "required": ["ready", "pools", "redis"],
    "properties": {
        "ready": {"type": "boolean"},
        "policy_version": {"type": "string"},
        "pools": {"type": "object", "additionalProperties": {"type": "boolean"}},
        "required": {"type": "array", "items": {"type": "string"},
                     "description": "pools without which the gateway is not ready"},
        "degraded": {"type": "array", "items": {"type": "string"},
                     "description": "optional pools that are down (the gateway stays ready)"},
        "engines": {"type": "object", "additionalProperties": {"type": "string"}},
        "redis": {"type": "boolean"},
        "status": {"enum": ["ready", "degraded", "not_ready"],
                   "description": "degraded (200): an optional pool is down, or the policy file does not hold the "
                   "policy served"},
        "worker": {"type": "string", "description": "the answering process: its index under --workers, else its pid"},
        "reasons": {"type": "array", "items": {"type": "string"},
                    "description": "why status is not ready, one sentence per cause with what to do (empty if ready)"},
        "policy": {"type": ["object", "null"], "description": "the policy file beside the policy served "
                   "(gateway/control/policy/policy_file.py)", "properties": {
                       "source": {"type": "string"}, "served_version": {"type": "string"},
                       "served_since": {"type": "number"}, "file_version": {"type": ["string", "null"]},
                       "matches_file": {"type": "boolean"}, "last_reload_at": {"type": ["number", "null"]},
                       "last_error": {"type": ["object", "null"]},
                       "reason": {"type": ["string", "null"], "description": "why the file does not hold the policy "
                                  "served, with what to do (null while it does)"}}},
        "routing": {"type": "object", "description": "the routing threshold in use and where it came from",
                    "properties": {
            "policy_version": {"type": "string"}, "threshold": {"type": "number"},
            "source": {"enum": ["policy", "initial", "share-held", "ladder-raised"]},
            "routing_threshold": {"type": "number"}, "description": {"type": "string"},
            "tradeoff": {"type": ["object", "null"], "description": "a tiers policy's tradeoff in use and where it "
                         "came from (null without tiers)", "properties": {
                             "value": {"type": ["number", "null"]},
                             "source": {"enum": ["policy", "per-request", "window-held"]},
                             "samples": {"type": ["integer", "null"]},
                             "cost_per_1k_usd": {"type": ["number", "null"]}, "description": {"type": "string"}}}}},
    },
}

# Every status the chat endpoint can answer with, besides 200, and why.
_CHAT_ERRORS = {
    "400": "invalid request (malformed JSON, schema violation, too many messages, context too long)",
    "401": "missing or invalid API key",
    "403": "the tenant may not use the requested pool",
    "404": "unknown model",
    "413": "request body too large",
    "429": "rate limit or budget exceeded (see Retry-After)",
    "502": "the engine failed or rejected the request",
    "503": "no replica of the pool is available, or the tenant's limits cannot be checked (Redis unreachable) and "
           "its policy fails closed (see Retry-After)",
    "504": "the request deadline passed",
}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _error(description: str) -> dict[str, Any]:
    return _json({"$ref": "#/components/schemas/Error"}, description)


_RESPONSE: dict[str, Any] = {
    "type": "object",
    "description": "The engine's response object (passed through; `usage` has input_tokens / output_tokens).",
    "required": ["id", "object", "output"],
    "properties": {"id": {"type": "string"}, "object": {"const": "response"}, "model": {"type": "string"},
                   "status": {"type": "string"}, "output": {"type": "array", "items": {"type": "object"}},
                   "usage": {"type": ["object", "null"]}},
}

_TEXT_COMPLETION: dict[str, Any] = {
    "type": "object",
    "description": "The engine's text_completion object (passed through).",
    "required": ["id", "object", "choices"],
    "properties": {"id": {"type": "string"}, "object": {"const": "text_completion"}, "model": {"type": "string"},
                   "choices": {"type": "array", "items": {"type": "object"}}, "usage": {"type": ["object", "null"]}},
}

# (path, operation id, request model, request schema name, answer schema name, answer schema, summary)
_Operation = tuple[str, str, type[Any], str, str, dict[str, Any], str]
_OPERATIONS: tuple[_Operation, ...] = (
    ("/v1/chat/completions", "createChatCompletion", ChatRequest, "ChatCompletionRequest", "ChatCompletion",
     _COMPLETION, "Route a chat completion to a pool (model `auto`, a pool name, an alias or a rule model)"),
    ("/v1/responses", "createResponse", ResponsesRequest, "ResponseRequest", "Response", _RESPONSE,
     "Route a Responses API request like a chat request (its instructions and input are scored); stateless: "
     "previous_response_id, conversation, item_reference items and background are refused with 400"),
    ("/v1/completions", "createCompletion", CompletionsRequest, "CompletionRequest", "TextCompletion",
     _TEXT_COMPLETION, "Route a legacy completion (its prompt is scored; token-array prompts are routed without "
     "text)"),
)


_EMBEDDING_LIST: dict[str, Any] = {
    "type": "object",
    "description": "The engine's list of embeddings (passed through): one per input, floats or base64 float32.",
    "required": ["object", "data"],
    "properties": {"object": {"const": "list"}, "model": {"type": "string"},
                   "data": {"type": "array", "items": {"type": "object", "properties": {
                       "index": {"type": "integer"}, "object": {"const": "embedding"},
                       "embedding": {"type": ["array", "string"]}}}},
                   "usage": {"type": ["object", "null"]}},
}
_EMBEDDINGS: _Operation = ("/v1/embeddings", "createEmbedding", EmbeddingsRequest, "EmbeddingRequest", "EmbeddingList",
               _EMBEDDING_LIST, "Embed inputs on an embedding pool (model: an embedding pool, alias or served "
               "name, or `auto`: the tenant's one embedding pool); billed per input token")


def _request_schemas() -> dict[str, Any]:
    """The request models and the models they refer to, as OpenAPI component schemas."""
    components: dict[str, Any] = {}
    for path, _, model, name, _, _, _ in (*_OPERATIONS, _EMBEDDINGS):
        schema = model.model_json_schema(ref_template=_REF)
        components.update(schema.pop("$defs", {}))
        schema["description"] = f"An OpenAI {path} request. Fields not listed pass through to the engine."
        components[name] = schema
    return components


def _operation(operation_id: str, request: str, answer: str, summary: str, stream: bool = True) -> dict[str, Any]:
    content: dict[str, Any] = {"application/json": {"schema": {"$ref": f"#/components/schemas/{answer}"}}}
    if stream:
        content["text/event-stream"] = {"schema": _SSE_EVENT}
    ok = {"description": "the answer (JSON), or server-sent events when `stream` is true" if stream else "the answer",
          "content": content}
    return {
        "operationId": operation_id,
        "summary": summary,
        "security": [{"bearer": []}, {}],
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{request}"}}},
        },
        "responses": {"200": ok, **{code: _error(why) for code, why in _CHAT_ERRORS.items()}},
    }


_FEEDBACK_RESULT: dict[str, Any] = {
    "type": "object",
    "required": ["object", "request_id", "score", "stored"],
    "properties": {"object": {"const": "feedback"}, "request_id": {"type": "string"},
                   "score": {"type": "number", "minimum": 0, "maximum": 1}, "stored": {"const": True}},
}

_FEEDBACK_ERRORS = {
    "400": "invalid body (see `param`), or a gateway without the Redis ledger",
    "401": "missing or invalid API key",
    "404": "no request with this id from the caller's tenant (unknown, expired or another tenant's)",
    "413": "request body too large",
}


def _feedback_operation() -> dict[str, Any]:
    return {
        "operationId": "createFeedback",
        "summary": "Rate one of your own answers (by its x-request-id): a score in [0, 1] or thumbs up/down",
        "security": [{"bearer": []}, {}],
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/FeedbackRequest"}}},
        },
        "responses": {"200": _json({"$ref": "#/components/schemas/FeedbackResult"}, "stored (last feedback wins)"),
                      **{code: _error(why) for code, why in _FEEDBACK_ERRORS.items()}},
    }


def _get(operation_id: str, summary: str, responses: dict[str, Any]) -> dict[str, Any]:
    return {"get": {"operationId": operation_id, "summary": summary, "responses": responses}}


def build_openapi(version: str = "0") -> dict[str, Any]:
    """The OpenAPI document (a fresh dict; JSON-serialisable)."""
    return {
        "openapi": "3.1.0",
        "info": {"title": "cascade gateway", "version": version,
                 "description": "OpenAI-compatible gateway that routes each request to a model pool."},
        "paths": {
            **{path: {"post": _operation(op, request, answer, summary)}
               for path, op, _, request, answer, _, summary in _OPERATIONS},
            _EMBEDDINGS[0]: {"post": _operation(_EMBEDDINGS[1], _EMBEDDINGS[3], _EMBEDDINGS[4], _EMBEDDINGS[6],
                                                stream=False)},
            "/v1/feedback": {"post": _feedback_operation()},
            **batch_paths(),
            "/v1/models": _get("listModels", "Models a client may ask for",
                               {"200": _json({"$ref": "#/components/schemas/ModelList"}, "the models")}),
            "/healthz": _get("healthz", "Liveness", {"200": _json(
                {"type": "object", "required": ["status"], "properties": {"status": {"const": "ok"}}}, "alive")}),
            "/readyz": _get("readyz", "Readiness: Redis answers, every pool required for readiness has a usable "
                            "replica, and some pool does", {
                "200": _json({"$ref": "#/components/schemas/Readiness"}, "ready"),
                "503": _json({"$ref": "#/components/schemas/Readiness"}, "not ready (the body says what)"),
            }),
        },
        "components": {
            "schemas": {**_request_schemas(),
                        **{answer: schema for *_, answer, schema, _ in (*_OPERATIONS, _EMBEDDINGS)},
                        "ModelList": _MODELS,
                        "Readiness": _READY, "Error": ERROR_SCHEMA,
                        "FeedbackRequest": Feedback.model_json_schema(ref_template=_REF),
                        "FeedbackResult": _FEEDBACK_RESULT, **batch_schemas()},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "tenant API key (optional when no tenants have keys)"}},
        },
    }
