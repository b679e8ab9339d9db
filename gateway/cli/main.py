"""The `cascade` command: one entry point, one sub-command per job.

Sub-commands register themselves from their own modules (`register(subparsers)`), so this file only
wires them; heavy imports happen inside each command, never for `--help`.
"""

from __future__ import annotations

import argparse
import sys

from gateway.settings import export_home

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    from backends.models.cli import register as register_models
    from backends.quantization.cli import register as register_quantize
    from gateway.cli.calibrate import register as register_calibrate
    from gateway.cli.demo import register as register_demo
    from gateway.cli.keys import register as register_keys
    from gateway.cli.policy import register as register_policy
    from gateway.cli.pool import register as register_pool
    from gateway.cli.router_tiers import register as register_router_tiers
    from gateway.cli.serve import register as register_serve
    from gateway.costs.cli import register as register_costs
    from gateway.deploy.cli import register as register_deploy
    from gateway.planning.cli import register as register_plan
    from router_models.cli import register as register_router

    parser = argparse.ArgumentParser(
        prog="cascade", description="Cascade routing gateway: one OpenAI-compatible endpoint, tiered vLLM pools.",
    )
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    register_serve(sub)
    register_demo(sub)
    register_policy(sub)
    register_pool(sub)
    register_router(sub)
    register_calibrate(sub)  # `router calibrate`: needs policy prices, which router_models may not import
    register_router_tiers(sub)  # `router route` and `router pools`: the same
    register_costs(sub)
    register_keys(sub)
    register_models(sub)
    register_quantize(sub)
    register_deploy(sub)
    register_plan(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    export_home()  # one state folder for every command, its libraries and the engines it starts
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
