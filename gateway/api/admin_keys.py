"""`/admin/keys`: the API keys ops issue at run time (`gateway.tenancy.api_keys`), behind the admin key; the HTTP
twin of `cascade keys`.

- `GET /admin/keys[?tenant=T]` → `{"data": [key, ...]}` (descriptions, never keys);
- `POST /admin/keys` `{"tenant", "name"?, "rpm"?, "tpm"?, "daily_usd"? (USD), "expires_at"? (UTC epoch s)}` →
  201 `{"key": "sk-cascade-...", ...description}`: the key is in this answer only; the tenant must be one the running
  policy serves (`gateway.tenancy.api_keys.unknown_tenant`: a named tenant, or `default` under a policy that names
  none), else 400 naming what to do, unless `"allow_unknown": true` (201 with a `warning`);
- `DELETE /admin/keys/{id}` → the revoked key's description, 404 when no issued key has that id.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.api.auth import require_admin
from gateway.api.runtime import Runtime
from gateway.errors import BadRequest, GatewayError, NotFound
from gateway.tenancy.api_keys import KeyStore, unknown_tenant
from policies.money import usd_to_micro
from policies.schema import RateLimits

__all__ = ["admin_key_routes"]


def admin_key_routes() -> list[Route]:
    return [Route("/admin/keys", _keys, methods=["GET", "POST"]),
            Route("/admin/keys/{key_id}", _revoke, methods=["DELETE"])]


def _json(payload: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(payload), status, media_type="application/json")


def _store(request: Request) -> KeyStore:
    runtime: Runtime = request.app.state.runtime
    require_admin(request.headers.get("authorization"), runtime.settings.admin_key)
    if runtime.keys.store is None:
        raise BadRequest("this gateway runs without Redis: keys come from the policy only")
    return runtime.keys.store


async def _keys(request: Request) -> Response:
    try:
        store = _store(request)
        if request.method == "GET":
            keys = await store.list(request.query_params.get("tenant"))
            return _json({"data": [key.public() for key in keys]})
        spec = _create_body(await request.body(), request.app.state.runtime)
        secret, key = await store.create(spec["tenant"], spec["name"], limits=spec["limits"],
                                         daily_usd=spec["daily_usd"], expires_at=spec["expires_at"])
    except GatewayError as exc:
        return Response(exc.body(), exc.status, media_type="application/json")
    warning = {"warning": spec["warning"]} if spec["warning"] else {}
    return _json({"key": secret, **key.public(), **warning}, 201)


def _create_body(body: bytes, runtime: Runtime) -> dict[str, Any]:
    """The checked fields of a create request; `BadRequest` naming the field otherwise."""
    try:
        raw = orjson.loads(body or b"{}")
        tenant, name = raw["tenant"], str(raw.get("name", ""))
        limits = RateLimits(requests_per_minute=raw.get("rpm"), tokens_per_minute=raw.get("tpm"))
        daily = None if raw.get("daily_usd") is None else usd_to_micro(raw["daily_usd"])
        expires = None if raw.get("expires_at") is None else float(raw["expires_at"])
        allow = raw.get("allow_unknown", False) is True
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise BadRequest(f"a key needs a JSON body with tenant, and optional name, rpm, tpm, daily_usd, expires_at: "
                         f"{exc}", param="tenant") from exc
    current = runtime.policies.current
    problem = unknown_tenant(str(tenant), current.policy.tenants, current.source)
    if problem is not None and not allow:
        raise BadRequest(f"{problem}; or send \"allow_unknown\": true to create the key anyway", param="tenant")
    return {"tenant": tenant, "name": name, "limits": limits, "daily_usd": daily, "expires_at": expires,
            "warning": None if problem is None else f"created anyway: {problem.why}"}


async def _revoke(request: Request) -> Response:
    try:
        key = await _store(request).revoke(request.path_params["key_id"])
        if key is None:
            raise NotFound("no issued key has that id", param="key_id")
    except GatewayError as exc:
        return Response(exc.body(), exc.status, media_type="application/json")
    return _json(key.public())
