"""The HTTP surface: `create_app(settings)` is the one composition root.

Handlers parse, call the service, render. Every error leaves as the OpenAI error envelope.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from backends.background import stop
from gateway.api.admin_keys import admin_key_routes
from gateway.api.auth import bearer_matches, require_admin
from gateway.api.batches import batch_routes
from gateway.api.chat import OpenAIEndpoint, endpoint_apps
from gateway.api.embeddings import EmbeddingsEndpoint
from gateway.api.feedback import post_feedback
from gateway.api.openapi import build_openapi
from gateway.api.runtime import Runtime, build_runtime
from gateway.control.adaptation.live_threshold import routing_state
from gateway.control.fleet.host_cores import EngineCoreAvoidance
from gateway.control.policy.file_watch import FileWatcher
from gateway.control.policy.policy_file import refusal
from gateway.errors import (
    AuthenticationError,
    BadRequest,
    GatewayError,
    error_body,
)
from gateway.serving.openai.endpoints import EMBEDDINGS
from gateway.serving.routing.router_swap import watched_paths
from gateway.settings import Settings
from gateway.telemetry.gc_pauses import GcPauses, freeze_heap
from gateway.telemetry.loop_lag import LoopLag
from gateway.telemetry.metrics import CONTENT_TYPE
from gateway.telemetry.worker_gauges import worker_label
from policies.decide import AUTO_MODEL, rule_models
from policies.loader import PolicyError

__all__ = ["create_app"]

log = logging.getLogger("cascade.gateway")


def _json(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(payload), status, headers, media_type="application/json")


def _error(exc: GatewayError, request_id: str | None = None) -> Response:
    headers = {"x-request-id": request_id} if request_id else {}
    return Response(exc.body(), exc.status, {**headers, **exc.headers()}, media_type="application/json")


def _runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


async def list_models(request: Request) -> Response:
    loaded = _runtime(request).policies.current
    names = [AUTO_MODEL, *loaded.policy.pools, *loaded.policy.aliases, *rule_models(loaded.policy)]
    now = int(time.time())
    data = [{"id": n, "object": "model", "created": now, "owned_by": "cascade"} for n in names]
    return _json({"object": "list", "data": data})


async def metrics(request: Request) -> Response:
    """Open unless `Settings.metrics_key` (CASCADE_METRICS_KEY) asks for a bearer key: "admin" for the admin key,
    any other value for itself."""
    settings = _runtime(request).settings
    if settings.metrics_key:
        expected = settings.admin_key if settings.metrics_key == "admin" else settings.metrics_key
        if not _bearer_is(request, expected):
            what = "the admin key" if settings.metrics_key == "admin" else "the metrics key (CASCADE_METRICS_KEY)"
            return _error(AuthenticationError(f"/metrics needs {what} as a bearer token"))
    return Response(_runtime(request).metrics.render(), media_type=CONTENT_TYPE)


async def openapi(request: Request) -> Response:
    return Response(request.app.state.openapi, media_type="application/json")


async def healthz(request: Request) -> Response:
    return _json({"status": "ok"})


_NO_REDIS = "Redis does not answer: budgets, limits and the ledger cannot be kept; start it or fix CASCADE_REDIS_URL"


def _reasons(redis_ok: bool, required_down: list[str], down: list[str], pools: int,
             policy: dict[str, Any] | None) -> list[str]:
    """Why readiness is not plain "ready", one sentence each with what to do (empty when it is)."""
    reasons = [] if redis_ok else [_NO_REDIS]
    reasons += [f"pool {name!r} is required for readiness and has no ready replica (its progress: engines)"
                for name in required_down]
    if len(down) >= pools:
        reasons.append("no pool can take requests (their progress: engines)")
    reasons += [f"optional pool {name!r} has no ready replica; the other pools serve meanwhile (its progress: "
                "engines)" for name in down if name not in required_down]
    if policy is not None and policy["reason"] is not None:
        reasons.append(policy["reason"])
    return reasons


async def readyz(request: Request) -> Response:
    """503 while Redis is down, a pool required for readiness has no ready replica, or no pool at all can
    take requests. `status` is "degraded" (200) when an optional pool (remote and on-demand ones by default) is
    down, or when the policy file no longer holds the version this process serves (`policy`: an edit rejected or
    not applied yet; `gateway.control.policy.policy_file`); `reasons` says why, one sentence each. Each worker
    answers for itself (`worker`)."""
    runtime = _runtime(request)
    pools = runtime.pool_set.readiness()  # a sleeping on-demand pool counts as ready
    required = runtime.pool_set.required_for_ready()
    redis_ok = await runtime.redis_ok()
    down = sorted(name for name, ok in pools.items() if not ok)
    ready = redis_ok and not required.intersection(down) and len(down) < len(pools)
    router_version = runtime.scorer.version if runtime.scorer is not None else None
    overflow = getattr(runtime.scorer, "overflow_state", "none")  # the trained classifier's: loads after start
    degraded = [n for n in down if n not in required]
    policy = runtime.policy_file.state() if runtime.policy_file is not None else None
    status = "not_ready" if not ready else (
        "degraded" if degraded or (policy is not None and not policy["matches_file"]) else "ready")
    routing = routing_state(runtime.live_threshold, runtime.policies.current, runtime.degradation.state,
                            runtime.live_tradeoff)
    body = {"ready": ready, "status": status, "worker": worker_label(),
            "reasons": _reasons(redis_ok, sorted(required.intersection(down)), down, len(pools), policy),
            "policy_version": runtime.policies.current.version, "policy": policy, "routing": routing,
            "router_version": router_version, "router_overflow": overflow,
            "pools": pools,
            "required": sorted(required.intersection(pools)), "degraded": degraded,
            "engines": runtime.pool_set.status, "versions": runtime.pool_set.versions(),
            "autoscale": runtime.autoscaler.status() if runtime.autoscaler is not None else {}, "redis": redis_ok}
    return _json(body, 200 if ready else 503)


def _bearer_is(request: Request, expected: str | None) -> bool:
    return bearer_matches(request.headers.get("authorization"), expected)


def _require_admin(request: Request) -> None:
    require_admin(request.headers.get("authorization"), _runtime(request).settings.admin_key)


async def reload_policy(request: Request) -> Response:
    try:
        _require_admin(request)
        accept = request.query_params.get("accept_interruption", "").lower() in ("1", "true", "yes")
        loaded = await _runtime(request).reload_policy(accept_interruption=accept)
    except GatewayError as exc:
        return _error(exc)
    except PolicyError as exc:
        current = _runtime(request).policies.current
        _, message = refusal(exc, current.source, current.version)
        log.error(message, extra={"problems": exc.problems})
        details = orjson.loads(error_body(message, "invalid_policy", None, "invalid_policy"))
        details["error"]["problems"] = exc.problems
        return _json(details, 422)
    return _json({"policy_version": loaded.version, "source": loaded.source})


async def reload_router(request: Request) -> Response:
    """Load, check and serve the router artifact that is current now (`RouterSwap.reload`)."""
    try:
        _require_admin(request)
        version, changed = await _runtime(request).router_swap.reload()
    except GatewayError as exc:
        return _error(exc)
    except Exception as exc:  # a bad artifact, or none to load: the running router stays
        code = "no_router_artifact" if isinstance(exc, ValueError) else "invalid_router_artifact"
        log.error("router reload refused; the running router stays: %s", exc)
        return Response(error_body(f"router reload refused, the running router stays: {exc}",
                                   "invalid_request_error", None, code), 422, media_type="application/json")
    return _json({"router_version": version, "changed": changed})


async def admin_costs(request: Request) -> Response:
    """The finance report as one self-contained HTML page. Query: from, to (YYYY-MM-DD), by, wide (1: every
    column). The same summary, table and notes as `cascade costs report --format table`, but what they tell the
    reader to change is said in the page's query (`summary.PAGE`: wide=1, from=, to=), not in the command's flags."""
    from dataclasses import replace
    from datetime import UTC, date, datetime, timedelta

    from gateway.costs.by_key import load_key_rows
    from gateway.costs.html import render_html
    from gateway.costs.quality import served_with_quality
    from gateway.costs.report import GROUPINGS, load_report
    from gateway.costs.summary import PAGE
    from gateway.ledger.store import LedgerKeys
    from gateway.redis_client import safe_url

    runtime = _runtime(request)
    try:
        _require_admin(request)
        today = datetime.now(UTC).date()  # the ledger's days are UTC days
        start = date.fromisoformat(request.query_params.get("from", str(today - timedelta(days=6))))
        end = date.fromisoformat(request.query_params.get("to", str(today)))
        by = request.query_params.get("by", "tenant")
        if by not in (*GROUPINGS, "key") or end < start or (end - start).days > 366:
            raise BadRequest(f"use by={'|'.join((*GROUPINGS, 'key'))} and a range from <= to of at most a year",
                             param="by")
    except ValueError as exc:
        return _error(BadRequest(f"dates must be YYYY-MM-DD: {exc}", param="from"))
    except GatewayError as exc:
        return _error(exc)
    if runtime.redis is None:
        return _error(BadRequest("this gateway runs without the Redis ledger; no report to show"))
    keys = LedgerKeys(runtime.settings.redis_prefix)
    report = replace(await load_report(runtime.redis, keys, start, end), source=safe_url(runtime.settings.redis_url))
    key_rows = await load_key_rows(runtime.redis, keys, start, end) if by == "key" else None
    current = runtime.policies.current
    report = await served_with_quality(report.with_prices(current.policy, current.source), current.policy,
                                       runtime.settings.redis_url, runtime.settings.redis_prefix,
                                       runtime.settings.router_artifact)
    wide = request.query_params.get("wide", "") in ("1", "true")
    return Response(render_html(report, by, wide, key_rows, PAGE), media_type="text/html; charset=utf-8")


async def _http_error(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    message = {404: "no such endpoint", 405: "method not allowed"}.get(status, "request failed")
    return Response(error_body(f"{message}: {request.method} {request.url.path}", "invalid_request_error"),
                    status, media_type="application/json")


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.error("unhandled error", exc_info=exc, extra={"path": request.url.path})
    return Response(error_body("internal gateway error; see the gateway log", "internal_error"), 500,
                    media_type="application/json")


class GatewayApp:
    """The ASGI app: the OpenAI routes go straight to their raw endpoints (the hot path), everything else
    (and the lifespan) to the Starlette app. `state` is the Starlette app's state (`state.runtime`)."""

    def __init__(self, starlette: Starlette) -> None:
        self._starlette = starlette

        def runtime() -> Runtime:  # read at each request: the lifespan builds it
            current: Runtime = starlette.state.runtime
            return current

        self._openai: dict[str, OpenAIEndpoint] = {**endpoint_apps(runtime),
                                                   EMBEDDINGS.path: EmbeddingsEndpoint(runtime)}

    @property
    def state(self) -> Any:
        return self._starlette.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and (app := self._openai.get(scope["path"])):
            return await app(scope, receive, send)
        return await self._starlette(scope, receive, send)


async def _freeze_after(loader: threading.Thread, poll_s: float = 1.0) -> None:
    while loader.is_alive():  # in slices: a thread parked on join() would hold up the loop's shutdown
        await asyncio.to_thread(loader.join, poll_s)
    freeze_heap("router overflow loaded")


def create_app(settings: Settings, runtime: Runtime | None = None) -> GatewayApp:
    """The ASGI app. Without `runtime`, its lifespan builds one from `settings` (and closes it)."""

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        app.state.runtime = current = runtime or await build_runtime(settings)
        # a policy that cannot apply yet (a remote pool's new pods still starting) is tried again, 15 s apart
        # at the default 2 s watch interval
        retry_s = max(1.0, 7.5 * settings.policy_watch_interval_s)
        watchers = [FileWatcher([Path(current.policies.current.source)], current.reload_policy,
                                settings.policy_watch_interval_s, retry_s=retry_s)]
        if settings.scorer == "classifier":  # a promotion or rollback in the store swaps the router
            watchers.append(FileWatcher(watched_paths(settings), current.router_swap.reload,
                                        settings.policy_watch_interval_s, what="router"))
        if settings.policy_watch_interval_s > 0:
            for watcher in watchers:
                watcher.start()
        lag = LoopLag(current.metrics.loop_lag.observe)
        lag.start()
        pauses = GcPauses(current.metrics.gc.paused)
        pauses.install()
        # a serving process that starts no engine keeps off the CPU engines' cores (gateway.control.fleet.host_cores)
        placement = EngineCoreAvoidance() if settings.engine_cores == "avoid" and not settings.start_engines else None
        if placement is not None:
            placement.start()
        refreeze: asyncio.Task[None] | None = None
        if settings.gc_freeze:
            freeze_heap("start-up")
            loader = getattr(current.scorer, "overflow_loader", None)
            if loader is not None:  # the router's overflow model loads after start: its heap is long-lived too
                refreeze = asyncio.create_task(_freeze_after(loader), name="freeze-after-overflow")
        log.info("gateway up", extra={"policy_version": current.policies.current.version})
        try:
            yield
        finally:
            await stop(refreeze)
            if placement is not None:
                await placement.aclose()
            pauses.uninstall()
            await lag.aclose()
            for watcher in watchers:
                await watcher.aclose()
            if runtime is None:
                await current.aclose()

    routes = [
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/admin/policy/reload", reload_policy, methods=["POST"]),
        Route("/admin/router/reload", reload_router, methods=["POST"]),
        Route("/admin/costs", admin_costs, methods=["GET"]),
        *admin_key_routes(),
        Route("/v1/feedback", post_feedback, methods=["POST"]),
        *batch_routes(),
    ]
    handlers = {HTTPException: _http_error, Exception: _unexpected}
    starlette = Starlette(routes=routes, lifespan=lifespan, exception_handlers=handlers)
    starlette.state.openapi = orjson.dumps(build_openapi())
    return GatewayApp(starlette)
