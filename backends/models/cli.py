"""``cascade models ...`` sub-commands. The lead's ``cascade`` console script calls :func:`register`."""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

from backends.models.demo import DEMO_RECIPES, ensure_demo_models, models_root

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``models`` command group to the ``cascade`` parser's sub-parsers.

    Each leaf sets ``func``: a callable taking the parsed namespace and returning an exit code.
    """
    models = subparsers.add_parser(
        "models",
        help="build or check the local demo models",
        description="Manage the tiny demo models that the local engine pools serve.",
    )
    commands = models.add_subparsers(dest="models_command", metavar="COMMAND", required=True)
    names = ", ".join(f"{r.name} ({r.architecture})" for r in DEMO_RECIPES)
    build = commands.add_parser(
        "build",
        help="build the demo models if missing or corrupt",
        description=(
            f"Build the demo models ({names}) offline and deterministically, unless an intact "
            "copy is cached. Cached copies are verified against the sha256 manifest."
        ),
    )
    build.add_argument("--force", action="store_true", help="rebuild even when the cached copy is intact")
    build.add_argument(
        "--dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="cache directory (default: $CASCADE_HOME/models, else ./.cascade/models)",
    )
    build.set_defaults(func=_build)


def _build(args: argparse.Namespace) -> int:
    """Run ``models build``; prints one line per model. Returns 0 on success."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    root: Path = models_root() if args.dir is None else args.dir
    started = time.monotonic()
    built = ensure_demo_models(root, force=bool(args.force))
    for name, path in built.items():
        print(f"{name}: {path}")
    print(f"demo models ready in {time.monotonic() - started:.1f} s")
    return 0
