"""The `cascade` command: one entry point, one sub-command per job.

Sub-commands register themselves from their own packages (`register(subparsers)`), so this file only
wires them; heavy imports happen inside each command, never for `--help`.
"""

from __future__ import annotations

import argparse
import sys
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING

from backends.transports import DEFAULT_TRANSPORT, TRANSPORTS

if TYPE_CHECKING:
    from gateway.settings import Settings

__all__ = ["default_policy_path", "main"]


def default_policy_path() -> Path:
    """The demo policy shipped in the package (`policies/default.yaml`)."""
    return Path(str(files("policies").joinpath("default.yaml")))


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from gateway.api.app import create_app
    from gateway.api.workers import UVICORN_OPTIONS
    from gateway.logs import configure_logging
    from gateway.settings import Settings

    configure_logging(args.log_level, json=args.log_format == "json")
    problem = _startup_problem(Path(args.policy), args.scorer)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    settings = Settings(
        policy_path=Path(args.policy), scorer=args.scorer, start_engines=not args.no_engines,
        ledger=args.ledger, transport=args.transport, redis_prefix=args.redis_prefix,
        request_log=Path(args.request_log) if args.request_log else None,
        ledger_retention_days=args.ledger_retention_days,
    )
    if args.workers > 1:
        return _serve_workers(settings, args)
    uvicorn.run(create_app(settings), host=args.host, port=args.port, **UVICORN_OPTIONS)
    return 0


def _serve_workers(settings: Settings, args: argparse.Namespace) -> int:
    from gateway.api.workers import run_workers, workers_problem

    if args.ledger != "redis":
        print("error: --workers > 1 needs the Redis ledger (workers share limits, budgets and the ladder "
              "through Redis); drop --ledger memory", file=sys.stderr)
        return 1
    problem = workers_problem(settings)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    return run_workers(settings, args.host, args.port, args.workers, args.log_level, args.log_format == "json")


def _startup_problem(policy: Path, scorer: str) -> str | None:
    """Check what would make start-up fail, so `serve` says it in one line instead of a traceback."""
    from backends.quant_policy import checked_here
    from policies.loader import PolicyError, load_policy

    try:
        checked_here(load_policy(policy))
    except PolicyError as exc:
        return str(exc)
    if scorer == "classifier":
        from router_models.artifact import ArtifactError, load_artifact

        try:
            load_artifact()
        except ArtifactError as exc:
            return f"{exc} (or start with --scorer length|none)"
    return None


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _add_serve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "serve", help="run the gateway (and the policy's local engines) until stopped",
        description="Serve the OpenAI-compatible endpoint /v1/chat/completions. Local pools' vLLM engines "
        "start in the background; /readyz turns 200 once every pool has a ready replica.",
    )
    p.add_argument("--policy", default=str(default_policy_path()), help="policy YAML (default: the demo policy)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--workers", type=_positive, default=1, metavar="N",
                   help="gateway processes sharing the port (SO_REUSEPORT) and one Redis; local engines are "
                   "started once, by the parent process (default 1; rule of thumb: one per core)")
    p.add_argument("--scorer", choices=["classifier", "length", "none"], default="classifier",
                   help="complexity scorer: the trained classifier (default), a length heuristic, or none "
                   "(everything 'auto' goes to the micro pool)")
    p.add_argument("--no-engines", action="store_true",
                   help="do not start local engines; expect them on their base ports")
    p.add_argument("--ledger", choices=["redis", "memory"], default="redis",
                   help="where cost records go (memory: for experiments only, nothing is kept)")
    p.add_argument("--redis-prefix", default="cascade:", help="key prefix of the ledger in Redis")
    p.add_argument("--ledger-retention-days", type=int, default=35,
                   help="keep per-request cost records this long (rollups are kept for good)")
    p.add_argument("--transport", choices=TRANSPORTS, default=DEFAULT_TRANSPORT,
                   help=f"upstream HTTP client (default {DEFAULT_TRANSPORT}: lean, least CPU per token; "
                   "see BENCHMARKS.md)")
    p.add_argument("--request-log", metavar="FILE",
                   help="append each request (with its prompt) as JSONL for `cascade policy replay`; off by default")
    p.add_argument("--log-level", default="INFO", type=str.upper,
                   choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], help="default INFO (any case)")
    p.add_argument("--log-format", choices=["json", "plain"], default="json")
    p.set_defaults(func=_serve)


def _add_demo(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from gateway.cli.demo import add_arguments, run_demo

    p = sub.add_parser(
        "demo", help="the quick start: engines + gateway + sample traffic + cost report, then stop",
        description="Builds the demo models if needed, finds or starts Redis, starts the gateway with both "
        "demo engines, sends a mixed batch of prompts through the openai SDK, prints the routing and the "
        "cost totals, and stops everything it started.",
    )
    add_arguments(p)
    p.set_defaults(func=run_demo)


def build_parser() -> argparse.ArgumentParser:
    from backends.cli import register as register_models
    from backends.quant_cli import register as register_quantize
    from gateway.cli.calibrate import register as register_calibrate
    from gateway.cli.policy import register as register_policy
    from gateway.costs.cli import register as register_costs
    from gateway.deploy.cli import register as register_deploy
    from gateway.planning.cli import register as register_plan
    from router_models.cli import register as register_router

    parser = argparse.ArgumentParser(
        prog="cascade", description="Cascade routing gateway: one OpenAI-compatible endpoint, tiered vLLM pools.",
    )
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    _add_serve(sub)
    _add_demo(sub)
    register_policy(sub)
    register_router(sub)
    register_calibrate(sub)  # `router calibrate`: needs policy prices, which router_models may not import
    register_costs(sub)
    register_models(sub)
    register_quantize(sub)
    register_deploy(sub)
    register_plan(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
