"""The Files and Batch APIs (`gateway.batches`), as OpenAI serves them; every call is the caller's tenant's:

- `POST /v1/files` (multipart: `file`, `purpose`="batch", optional `expires_after[anchor]`="created_at" and
  `expires_after[seconds]`) -> the file object; 413 over the policy's `batches.max_file_bytes` (the body is counted as
  it is read, with or without a Content-Length: nothing more is read or spooled past it), 400 for another purpose, a
  file that is not UTF-8 text or a bad `expires_after`;
- `GET /v1/files/{id}`, `GET /v1/files/{id}/content` (the bytes, JSONL), `DELETE /v1/files/{id}`;
- `POST /v1/batches` `{"input_file_id", "endpoint", "completion_window": "24h", "metadata"?}` -> the batch object;
- `GET /v1/batches[?after=&limit=]` (newest first), `GET /v1/batches/{id}`, `POST /v1/batches/{id}/cancel`.

Another tenant's id answers 404, as an unknown one does.
"""

from __future__ import annotations

from contextlib import aclosing
from typing import Any

import orjson
from starlette.datastructures import FormData, UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.api.body_limit import BodyLimit
from gateway.api.runtime import Runtime
from gateway.batches.service import BatchService
from gateway.errors import BadRequest, GatewayError
from gateway.tenancy.api_keys import ApiKey

__all__ = ["batch_routes"]

_FORM_SLACK = 64 * 1024  # a multipart body's bytes besides the file: its boundaries, headers and purpose field


def batch_routes() -> list[Route]:
    return [Route("/v1/files", _upload, methods=["POST"]),
            Route("/v1/files/{file_id}", _file, methods=["GET", "DELETE"]),
            Route("/v1/files/{file_id}/content", _content, methods=["GET"]),
            Route("/v1/batches", _batches, methods=["GET", "POST"]),
            Route("/v1/batches/{batch_id}", _batch, methods=["GET"]),
            Route("/v1/batches/{batch_id}/cancel", _cancel, methods=["POST"])]


def _json(payload: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(payload), status, media_type="application/json")


def _error(exc: GatewayError) -> Response:
    return Response(exc.body(), exc.status, exc.headers(), media_type="application/json")


async def _caller(request: Request) -> tuple[BatchService, str]:
    """The batch service and the caller's tenant (`AuthenticationError` and the like otherwise)."""
    service, key = await _keyed(request)
    return service, key.tenant


async def _keyed(request: Request) -> tuple[BatchService, ApiKey]:
    """The batch service and the caller's API key."""
    runtime: Runtime = request.app.state.runtime
    client = request.client
    key = await runtime.keys.identify(runtime.policies.current.policy, request.headers.get("authorization"),
                                      client.host if client else None)
    if runtime.batches is None:
        raise BadRequest("this gateway runs without Redis (the memory ledger): it keeps no files or batches")
    return runtime.batches.service, key


async def _upload(request: Request) -> Response:
    try:
        service, tenant = await _caller(request)
        form = await _form(request, service.max_file_bytes)
        try:
            upload, purpose = form.get("file"), form.get("purpose")
            if not isinstance(upload, UploadFile) or not isinstance(purpose, str):
                raise BadRequest("a multipart form with a `file` and a `purpose` is needed", param="file")
            content = await upload.read(service.max_file_bytes + 1)
            file = await service.upload(tenant, upload.filename or "", purpose, content, _expires_after(form))
        finally:
            await form.close()
    except GatewayError as exc:
        return _error(exc)
    return _json(file.public())


async def _form(request: Request, max_file_bytes: int) -> FormData:
    """The upload's multipart form, its body counted as it is read: past `max_file_bytes` and the form's slack,
    BodyTooLarge at once (the parser then closes, so deletes, what it spooled)."""
    bound = BodyLimit(max_file_bytes + _FORM_SLACK, "the upload", f"a batch file may have {max_file_bytes} bytes",
                      param="file")
    bound.check_declared(request.headers)
    if request.headers.get("content-type", "").split(";")[0].strip().lower() != "multipart/form-data":
        raise BadRequest("a multipart form with a `file` and a `purpose` is needed", param="file")
    async with aclosing(request.stream()) as chunks, aclosing(bound.bounded(chunks)) as body:
        try:
            return await MultiPartParser(request.headers, body, max_files=1, max_fields=8).parse()
        except MultiPartException as exc:
            raise BadRequest(f"the multipart form could not be read: {exc.message}", param="file") from exc


def _expires_after(form: FormData) -> int | None:
    """The upload's `expires_after[seconds]` (None: not given); its anchor must be `created_at`, as OpenAI's."""
    anchor, seconds = form.get("expires_after[anchor]"), form.get("expires_after[seconds]")
    if anchor is None and seconds is None:
        return None
    if anchor != "created_at":
        raise BadRequest("expires_after[anchor] must be \"created_at\"", param="expires_after[anchor]")
    if not isinstance(seconds, str) or not seconds.strip().isdigit():
        raise BadRequest("expires_after[seconds] must be a whole number of seconds", param="expires_after[seconds]")
    return int(seconds)


async def _file(request: Request) -> Response:
    try:
        service, tenant = await _caller(request)
        file_id = request.path_params["file_id"]
        if request.method == "DELETE":
            return _json(await service.delete_file(tenant, file_id))
        return _json((await service.file(tenant, file_id)).public())
    except GatewayError as exc:
        return _error(exc)


async def _content(request: Request) -> Response:
    try:
        service, tenant = await _caller(request)
        content = await service.content(tenant, request.path_params["file_id"])
    except GatewayError as exc:
        return _error(exc)
    return Response(content, media_type="application/jsonl")


def _create_body(body: bytes) -> tuple[str, str, str, dict[str, str] | None]:
    try:
        raw = orjson.loads(body or b"{}")
        metadata = raw.get("metadata")
        if metadata is not None and not (isinstance(metadata, dict) and len(metadata) <= 16
                                         and all(isinstance(v, str) for v in metadata.values())):
            raise BadRequest("metadata must be an object of at most 16 string values", param="metadata")
        return str(raw["input_file_id"]), str(raw["endpoint"]), str(raw["completion_window"]), metadata
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise BadRequest(f"a batch needs a JSON body with input_file_id, endpoint and completion_window: {exc}",
                         param="input_file_id") from exc


async def _batches(request: Request) -> Response:
    try:
        service, key = await _keyed(request)
        tenant = key.tenant
        if request.method == "POST":
            input_file_id, endpoint, window, metadata = _create_body(await request.body())
            return _json((await service.create(tenant, input_file_id, endpoint, window, metadata, key)).public())
        limit = request.query_params.get("limit", "20")
        if not limit.isdigit():
            raise BadRequest("limit must be a whole number", param="limit")
        page, more = await service.list(tenant, request.query_params.get("after"), int(limit))
    except GatewayError as exc:
        return _error(exc)
    data = [b.public() for b in page]
    return _json({"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                  "last_id": data[-1]["id"] if data else None, "has_more": more})


async def _batch(request: Request) -> Response:
    try:
        service, tenant = await _caller(request)
        return _json((await service.get(tenant, request.path_params["batch_id"])).public())
    except GatewayError as exc:
        return _error(exc)


async def _cancel(request: Request) -> Response:
    try:
        service, tenant = await _caller(request)
        return _json((await service.cancel(tenant, request.path_params["batch_id"])).public())
    except GatewayError as exc:
        return _error(exc)
