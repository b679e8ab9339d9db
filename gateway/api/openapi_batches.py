"""The Files and Batch APIs in the OpenAPI document (`gateway.api.openapi`): their paths and object schemas, as
`gateway.api.batches` serves them."""

from __future__ import annotations

from typing import Any

__all__ = ["batch_paths", "batch_schemas"]

_TIMES = ("in_progress_at", "finalizing_at", "completed_at", "failed_at", "expired_at", "cancelling_at",
          "cancelled_at")
_FILE: dict[str, Any] = {
    "type": "object", "required": ["id", "object", "bytes", "created_at", "filename", "purpose"],
    "properties": {"id": {"type": "string"}, "object": {"const": "file"}, "bytes": {"type": "integer"},
                   "created_at": {"type": "integer"}, "filename": {"type": "string"},
                   "purpose": {"enum": ["batch", "batch_output"]}, "status": {"const": "processed"},
                   "expires_at": {"type": ["integer", "null"], "description": "UTC epoch s; the file is a 404 from "
                                  "then on (null: stored before files expired)"}},
}
_BATCH: dict[str, Any] = {
    "type": "object", "required": ["id", "object", "endpoint", "input_file_id", "status", "request_counts"],
    "properties": {
        "id": {"type": "string"}, "object": {"const": "batch"}, "endpoint": {"type": "string"},
        "input_file_id": {"type": "string"}, "completion_window": {"const": "24h"},
        "status": {"enum": ["validating", "in_progress", "finalizing", "completed", "failed", "expired", "cancelling",
                            "cancelled"]},
        "output_file_id": {"type": ["string", "null"]}, "error_file_id": {"type": ["string", "null"]},
        "created_at": {"type": "integer"}, "expires_at": {"type": "integer"},
        **{name: {"type": ["integer", "null"]} for name in _TIMES},
        "errors": {"type": ["object", "null"], "description": "validation errors: {object: list, data: [{code, "
                   "message, param, line}]}"},
        "request_counts": {"type": "object", "properties": {k: {"type": "integer"} for k in
                                                            ("total", "completed", "failed")}},
        "usage": {"type": "object"}, "metadata": {"type": ["object", "null"]},
    },
}
_CREATE: dict[str, Any] = {
    "type": "object", "required": ["input_file_id", "endpoint", "completion_window"],
    "properties": {"input_file_id": {"type": "string"},
                   "endpoint": {"enum": ["/v1/chat/completions", "/v1/completions", "/v1/responses",
                                         "/v1/embeddings"]},
                   "completion_window": {"const": "24h"},
                   "metadata": {"type": "object", "additionalProperties": {"type": "string"}, "maxProperties": 16}},
}
_UPLOAD: dict[str, Any] = {
    "type": "object", "required": ["file", "purpose"],
    "properties": {"file": {"type": "string", "format": "binary", "description": "JSONL: one {custom_id, method, "
                            "url, body} a line"}, "purpose": {"const": "batch"},
                   "expires_after[anchor]": {"const": "created_at"},
                   "expires_after[seconds]": {"type": "integer", "minimum": 3600, "maximum": 2_592_000,
                                              "description": "the file expires this long after its creation, or "
                                              "after the policy's batches.file_ttl_days if sooner"}},
}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _param(name: str, where: str = "path", schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": name, "in": where, "required": where == "path", "schema": schema or {"type": "string"}}


def _op(operation_id: str, summary: str, answer: dict[str, Any], errors: str,
        body: dict[str, Any] | None = None, params: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    responses = {"200": {"description": "the answer", "content": {"application/json": {"schema": answer}}}}
    for code in errors.split():
        responses[code] = {"description": "see the error's message",
                           "content": {"application/json": {"schema": _ref("Error")}}}
    op: dict[str, Any] = {"operationId": operation_id, "summary": summary, "security": [{"bearer": []}, {}],
                          "responses": responses}
    if body is not None:
        op["requestBody"] = {"required": True, "content": body}
    if params:
        op["parameters"] = list(params)
    return op


def batch_paths() -> dict[str, Any]:
    listed = {"type": "object", "properties": {"object": {"const": "list"}, "data": {"type": "array",
              "items": _ref("Batch")}, "first_id": {"type": ["string", "null"]},
              "last_id": {"type": ["string", "null"]}, "has_more": {"type": "boolean"}}}
    deleted = {"type": "object", "properties": {"id": {"type": "string"}, "object": {"const": "file"},
                                                "deleted": {"const": True}}}
    file_id, batch_id = _param("file_id"), _param("batch_id")
    page = (_param("after", "query"), _param("limit", "query", {"type": "integer", "minimum": 1, "maximum": 100}))
    return {
        "/v1/files": {"post": _op("createFile", "Upload a batch input file (purpose batch)", _ref("File"),
                                  "400 401 413", {"multipart/form-data": {"schema": _ref("FileUpload")}})},
        "/v1/files/{file_id}": {
            "get": _op("retrieveFile", "A file of the caller's tenant", _ref("File"), "401 404", params=(file_id,)),
            "delete": _op("deleteFile", "Delete a file of the caller's tenant", deleted, "401 404",
                          params=(file_id,))},
        "/v1/files/{file_id}/content": {"get": _op("downloadFile", "A file's bytes (JSONL)", {"type": "string"},
                                                   "401 404", params=(file_id,))},
        "/v1/batches": {
            "post": _op("createBatch", "Create a batch: its lines routed like requests, sent while pools have "
                        "headroom, billed at the batch discount", _ref("Batch"), "400 401 404 429",
                        {"application/json": {"schema": _ref("BatchCreate")}}),
            "get": _op("listBatches", "The caller's batches, newest first (after, limit)", listed, "400 401",
                       params=page)},
        "/v1/batches/{batch_id}": {"get": _op("retrieveBatch", "A batch of the caller's tenant", _ref("Batch"),
                                              "401 404", params=(batch_id,))},
        "/v1/batches/{batch_id}/cancel": {"post": _op("cancelBatch", "Cancel a batch (400 once it has finished)",
                                                      _ref("Batch"), "400 401 404", params=(batch_id,))},
    }


def batch_schemas() -> dict[str, Any]:
    return {"File": _FILE, "FileUpload": _UPLOAD, "Batch": _BATCH, "BatchCreate": _CREATE}
