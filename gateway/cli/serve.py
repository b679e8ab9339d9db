"""`cascade serve`: run the gateway (and the policy's local engines) until stopped."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from gateway.settings import Settings, add_arguments, argparse_type, from_args, positive_int
from policies.loader import default_policy_path

__all__ = ["register"]


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from gateway.api.app import create_app
    from gateway.api.workers import UVICORN_OPTIONS
    from gateway.logs import configure_logging
    from router_models.serving.blas_threads import scoring_threads

    configure_logging(args.log_level, json=args.log_format == "json")
    problem = _startup_problem(Path(args.policy), args.scorer, args.router_artifact, args.router_overflow)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    settings = replace(from_args(args, Path(args.policy)), gc_freeze=args.gc_freeze)
    if args.workers > 1:
        return _serve_workers(settings, args)
    app = create_app(settings)
    scoring_threads()  # this process is the gateway's own (router_models.serving.blas_threads)
    uvicorn.run(app, host=args.host, port=args.port, **UVICORN_OPTIONS)
    return 0


def _serve_workers(settings: Settings, args: argparse.Namespace) -> int:
    from gateway.api.workers import run_workers, workers_problem

    if settings.ledger != "redis":
        print("error: --workers > 1 needs the Redis ledger (workers share limits, budgets and the ladder "
              "through Redis); drop --ledger memory", file=sys.stderr)
        return 1
    problem = workers_problem(settings)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    return run_workers(settings, args.host, args.port, args.workers, args.log_level, args.log_format == "json")


def _startup_problem(policy: Path, scorer: str, artifact: Path | None = None, overflow: str = "none") -> str | None:
    """Check what would make start-up fail, so `serve` says it in one line instead of a traceback."""
    from backends.machine_checks import checked_here
    from policies.loader import PolicyError, load_policy

    try:
        checked_here(load_policy(policy))
    except PolicyError as exc:
        return str(exc)
    if scorer == "classifier":
        from router_models.serving.artifact import ArtifactError, load_artifact, overflow_artifact

        try:
            load_artifact(artifact)
            overflow_artifact(artifact, overflow)
        except ArtifactError as exc:
            return f"{exc} (or start with --scorer length|none)"
    return None


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `serve`; every setting of `gateway.settings.OPTIONS` is a flag with an environment variable."""
    p = sub.add_parser(
        "serve", help="run the gateway (and the policy's local engines) until stopped",
        description="Serve the OpenAI-compatible endpoint /v1/chat/completions. Local pools' vLLM engines "
        "start in the background; /readyz turns 200 once every pool has a ready replica.",
    )
    p.add_argument("--policy", default=str(default_policy_path()), help="policy YAML (default: the demo policy)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--workers", type=argparse_type(positive_int, "workers"), default=1, metavar="N",
                   help="gateway processes sharing the port (SO_REUSEPORT) and one Redis; local engines are "
                   "started once, by the parent process (default 1; rule of thumb: one per core)")
    p.add_argument("--log-level", default="INFO", type=str.upper,
                   choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], help="default INFO (any case)")
    p.add_argument("--log-format", choices=["json", "plain"], default="json")
    p.add_argument("--no-gc-freeze", dest="gc_freeze", action="store_false",
                   help="leave the long-lived heap (models, tokenizers, policy) in the cyclic garbage collector; "
                   "by default it is frozen out once start-up is done and after each policy or router swap, so "
                   "a collection walks only what requests create (gateway.telemetry.gc_pauses; for A/B runs)")
    add_arguments(p)
    p.set_defaults(func=_serve)
